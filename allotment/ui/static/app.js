// Allotment capacity view: vanilla JavaScript, no library, no build step.
// Reads only this server's HTTP API, with the token kept in sessionStorage.
// Every text from the API goes into the page as text (never as HTML).
'use strict';
(function () {
  const BASE = location.pathname.replace(/allotment\/ui\/?$/, '');
  const VERSION = 'placement 1.39';
  const TOKEN_KEY = 'allotment.token';
  const PAGE_SIZE = 20;
  const NUMBER = new Intl.NumberFormat('en-US');
  const view = document.getElementById('view');
  const statusLine = document.getElementById('status');
  let renderCount = 0;

  // -- helpers ------------------------------------------------------------
  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
      else if (key === 'class') node.className = value;
      else if (key === 'style') Object.assign(node.style, value);  // CSSOM: allowed by the CSP
      else node.setAttribute(key, value === true ? '' : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const num = (n) => NUMBER.format(n);
  const pct = (part, whole) => (whole > 0 ? Math.round((part / whole) * 1000) / 10 : 0);
  function human(rc, n) {
    if (rc === 'MEMORY_MB' && Math.abs(n) >= 1024) return (n / 1024).toFixed(n % 1024 ? 1 : 0) + ' GiB';
    if (rc === 'DISK_GB' && Math.abs(n) >= 1024) return (n / 1024).toFixed(n % 1024 ? 1 : 0) + ' TiB';
    return null;
  }
  function amount(rc, n) {
    const extra = human(rc, n);
    return extra ? num(n) + ' (' + extra + ')' : num(n);
  }
  function amountCell(rc, n) {  // the number, and below it the same in GiB/TiB where that reads better
    const extra = human(rc, n);
    return extra ? [num(n), h('span', {class: 'sub'}, extra)] : num(n);
  }
  const short = (uuid) => (uuid ? uuid.slice(0, 8) : '');
  const providerLink = (uuid, name) => h('a', {href: '#/provider/' + uuid}, name || uuid);
  function status(text) { statusLine.textContent = text || ''; }

  function bar(rc, used, capacity) {
    const share = pct(used, capacity);
    const level = share >= 90 ? ' full' : share >= 75 ? ' warn' : '';
    const label = rc + ': ' + num(used) + ' of ' + num(capacity) + ' used (' + share + '%), '
      + num(capacity - used) + ' free';
    return h('div', {class: 'bar' + level, role: 'img', 'aria-label': label, title: label},
      h('span', {class: 'used', style: {width: Math.min(100, share) + '%'}}));
  }
  const legend = () => h('p', {class: 'legend'},
    h('span', null, h('span', {class: 'swatch used'}), 'used'),
    h('span', null, h('span', {class: 'swatch warn'}), 'used, 75% or more'),
    h('span', null, h('span', {class: 'swatch full'}), 'used, 90% or more'),
    h('span', null, h('span', {class: 'swatch free'}), 'free'),
    h('span', null, 'Capacity = (total − reserved) × allocation ratio: what can be allocated.'));

  // -- the API -----------------------------------------------------------------
  class AuthError extends Error {
    constructor(status) { super(status === 401 ? 'The token was refused (401): sign in again.'
      : 'This token may not read the capacity view (403): the policy rule allotment:capacity allows '
        + 'administrators by default.'); this.status = status; }
  }
  class ApiError extends Error {
    constructor(status, detail) { super(detail || ('HTTP ' + status)); this.status = status; }
  }
  async function api(path) {
    const response = await fetch(BASE + path.replace(/^\//, ''), {
      headers: {'X-Auth-Token': sessionStorage.getItem(TOKEN_KEY) || '', 'OpenStack-API-Version': VERSION,
                'Accept': 'application/json'},
      credentials: 'omit', cache: 'no-store'});
    if (response.status === 401 || response.status === 403) throw new AuthError(response.status);
    const text = await response.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch (error) { body = null; }
    if (!response.ok) {
      const detail = body && body.errors && body.errors[0] ? body.errors[0].detail : text;
      throw new ApiError(response.status, detail);
    }
    return body;
  }
  const query = (params) => {
    const parts = [];
    for (const [key, value] of Object.entries(params)) {
      if (value !== '' && value !== null && value !== undefined) {
        parts.push(encodeURIComponent(key) + '=' + encodeURIComponent(value));
      }
    }
    return parts.length ? '?' + parts.join('&') : '';
  };

  // -- sign in -----------------------------------------------------------------
  function showLogin(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    document.getElementById('nav').hidden = true;
    document.getElementById('signout').hidden = true;
    view.replaceChildren();
    const error = document.getElementById('login-error');
    error.textContent = message || '';
    error.hidden = !message;
    document.getElementById('login').hidden = false;
    document.documentElement.dataset.view = 'login';
    document.documentElement.dataset.state = 'ready';
    status('');
    document.getElementById('token').focus();
  }
  document.getElementById('login-form').addEventListener('submit', (event) => {
    event.preventDefault();
    const input = document.getElementById('token');
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    input.value = '';
    document.getElementById('login').hidden = true;
    if (!location.hash || location.hash === '#/' || location.hash === '#') location.hash = '#/overview';
    else render();
  });
  document.getElementById('signout').addEventListener('click', () => showLogin(''));

  // -- routing -----------------------------------------------------------------
  function route() {
    const hash = location.hash.replace(/^#\/?/, '');
    const [path, search] = hash.split('?');
    const params = Object.fromEntries(new URLSearchParams(search || ''));
    const parts = path.split('/');
    return {name: parts[0] || 'overview', arg: parts[1] ? decodeURIComponent(parts[1]) : null, params};
  }
  const VIEWS = {overview: renderOverview, trees: renderTrees, provider: renderProvider,
                 projects: renderProjects, fit: renderFit};
  async function render() {
    if (!sessionStorage.getItem(TOKEN_KEY)) { showLogin(''); return; }
    const current = route();
    const draw = VIEWS[current.name] || renderOverview;
    const mine = ++renderCount;
    document.getElementById('login').hidden = true;
    document.getElementById('nav').hidden = false;
    document.getElementById('signout').hidden = false;
    for (const link of document.querySelectorAll('nav a')) {
      const active = link.dataset.view === current.name
        || (current.name === 'provider' && link.dataset.view === 'trees');
      if (active) link.setAttribute('aria-current', 'page'); else link.removeAttribute('aria-current');
    }
    document.documentElement.dataset.view = current.name;
    document.documentElement.dataset.state = 'loading';
    status('Loading…');
    try {
      const content = await draw(current);
      if (mine !== renderCount) return;  // a newer navigation won
      view.replaceChildren(content);
      document.documentElement.dataset.state = 'ready';
      status('');
      requestAnimationFrame(() => requestAnimationFrame(() => {
        performance.mark('allotment:painted:' + current.name);
      }));
    } catch (error) {
      if (mine !== renderCount) return;
      if (error instanceof AuthError) { showLogin(error.message); return; }
      view.replaceChildren(h('h1', null, 'Something went wrong'),
        h('p', {class: 'alert', role: 'alert'}, error.message));
      document.documentElement.dataset.state = 'error';
      status('');
    }
  }
  window.addEventListener('hashchange', render);

  // -- overview ----------------------------------------------------------------
  function classTable(rows, caption) {
    return h('div', {class: 'table-wrap'}, h('table', {class: 'classes stack'},
      h('caption', null, caption),
      h('thead', null, h('tr', null, h('th', {scope: 'col'}, 'Resource class'), h('th', {scope: 'col'}, 'Usage'),
        h('th', {scope: 'col', class: 'num'}, 'Used'), h('th', {scope: 'col', class: 'num'}, 'Free'),
        h('th', {scope: 'col', class: 'num'}, 'Capacity'), h('th', {scope: 'col', class: 'num'}, 'Total'),
        h('th', {scope: 'col', class: 'num'}, 'Reserved'))),
      h('tbody', null, rows.map((row) => h('tr', {'data-rc': row.resource_class},
        h('th', {scope: 'row'}, row.resource_class),
        h('td', null, bar(row.resource_class, row.used, row.capacity),
          h('span', {class: 'bar-label'}, pct(row.used, row.capacity) + '% used')),
        ['used', 'free', 'capacity', 'total', 'reserved'].map((field) => h('td', {class: 'num', 'data-field': field,
          'data-label': field[0].toUpperCase() + field.slice(1)}, amountCell(row.resource_class, row[field]))))))));
  }

  async function renderOverview(current) {
    const filter = {member_of: current.params.member_of || '', trait: current.params.trait || ''};
    const data = await api('allotment/capacity' + query(filter));
    const aggregate = h('select', {id: 'f-aggregate', name: 'member_of'},
      h('option', {value: ''}, 'All aggregates'),
      data.aggregates.map((a) => h('option', {value: a.uuid, selected: a.uuid === filter.member_of},
        a.uuid + ' (' + a.providers + ' providers)')));
    const trait = h('select', {id: 'f-trait', name: 'trait'},
      h('option', {value: ''}, 'All traits'),
      data.traits.map((t) => h('option', {value: t.name, selected: t.name === filter.trait},
        t.name + ' (' + t.providers + ')')));
    const form = h('form', {class: 'filters', 'aria-label': 'Filter', onsubmit: (event) => {
      event.preventDefault();
      location.hash = '#/overview' + query({member_of: aggregate.value, trait: trait.value});
    }},
      h('div', null, h('label', {for: 'f-aggregate'}, 'Aggregate'), aggregate),
      h('div', null, h('label', {for: 'f-trait'}, 'Trait'), trait),
      h('button', {type: 'submit'}, 'Apply'),
      (filter.member_of || filter.trait) ? h('a', {href: '#/overview'}, 'Show the whole cloud') : null);
    const scope = filter.member_of || filter.trait
      ? 'Providers' + (filter.member_of ? ' in aggregate ' + filter.member_of : '')
        + (filter.member_of && filter.trait ? ' and' : '') + (filter.trait ? ' with trait ' + filter.trait : '')
        + ' (or whose root provider is / has it)'
      : 'The whole cloud';
    const cards = h('ul', {class: 'cards'},
      [['providers', 'resource providers'], ['roots', 'provider trees (compute nodes and other roots)'],
       ['consumers', 'consumers holding allocations']].map(([key, what]) =>
        h('li', {'data-count': key}, h('span', {class: 'number'}, num(data[key])), h('span', {class: 'what'}, what))));
    return h('section', {'aria-labelledby': 'title'},
      h('h1', {id: 'title'}, 'Capacity overview'),
      h('p', {class: 'lead'}, scope + ': how much of each resource class exists, is used and is free.'),
      form, cards,
      data.resource_classes.length ? [legend(), classTable(data.resource_classes, 'Per resource class, summed over '
        + (filter.member_of || filter.trait ? 'the selected providers' : 'every provider'))]
        : h('p', {class: 'note'}, 'No inventory here.'));
  }

  // -- trees -------------------------------------------------------------------
  function chips(items, kind, label) {
    if (!items.length) return null;
    const shown = items.slice(0, 8);
    const list = h('ul', {class: 'chips', 'aria-label': label},
      shown.map((item) => h('li', {class: 'chip ' + kind, title: item}, kind === 'agg' ? 'agg ' + short(item) : item)));
    if (items.length > shown.length) {
      list.append(h('li', null, h('details', null, h('summary', null, '+' + (items.length - shown.length) + ' more'),
        items.slice(8).map((item) => h('span', {class: 'chip ' + kind}, item)))));
    }
    return list;
  }
  function usageGrid(inventories) {
    const classes = Object.keys(inventories).sort();
    if (!classes.length) return null;
    return h('div', {class: 'usage'}, classes.map((rc) => {
      const inv = inventories[rc];
      return [h('span', {class: 'rc'}, rc), bar(rc, inv.used, inv.capacity),
        h('span', {class: 'bar-label', 'data-rc': rc}, num(inv.used) + ' / ' + num(inv.capacity) + ' used')];
    }));
  }
  function treeCard(tree) {
    return h('article', {class: 'tree', 'data-root': tree.root},
      h('header', null, h('h3', null, providerLink(tree.root, tree.name)),
        h('span', {class: 'bar-label'}, 'fullest class ' + Math.round(tree.fullness * 1000) / 10 + '% used'),
        h('span', {class: 'bar-label'}, tree.providers.length + (tree.providers.length === 1 ? ' provider' : ' providers'))),
      h('ul', null, tree.providers.map((rp) => h('li', {class: 'rp depth-' + Math.min(rp.depth, 4), 'data-uuid': rp.uuid},
        h('div', {class: 'rp-head'}, rp.depth ? providerLink(rp.uuid, rp.name) : h('strong', null, 'root'),
          h('span', {class: 'mono', title: rp.uuid}, rp.uuid)),
        usageGrid(rp.inventories),
        chips(rp.traits, 'trait', 'Traits of ' + rp.name), chips(rp.aggregates, 'agg', 'Aggregates of ' + rp.name)))));
  }
  async function renderTrees(current) {
    const search = current.params.search || '';
    const sort = current.params.sort === 'fullness' ? 'fullness' : 'name';
    const page = Math.max(1, parseInt(current.params.page || '1', 10) || 1);
    const data = await api('allotment/capacity/trees' + query({search, sort, limit: PAGE_SIZE,
                                                               offset: (page - 1) * PAGE_SIZE}));
    const pages = Math.max(1, Math.ceil(data.total / PAGE_SIZE));
    const input = h('input', {id: 't-search', type: 'search', value: search, placeholder: 'cn-0042 or 3f2a…'});
    const order = h('select', {id: 't-sort'}, h('option', {value: 'name', selected: sort === 'name'}, 'Name, A to Z'),
      h('option', {value: 'fullness', selected: sort === 'fullness'}, 'Fullest first'));
    const go = (p) => { location.hash = '#/trees' + query({search, sort: sort === 'name' ? '' : sort, page: p > 1 ? p : ''}); };
    const form = h('form', {class: 'filters', role: 'search', onsubmit: (event) => {
      event.preventDefault();
      location.hash = '#/trees' + query({search: input.value.trim(), sort: order.value === 'name' ? '' : order.value});
    }},
      h('div', null, h('label', {for: 't-search'}, 'Search a provider by name or UUID'), input),
      h('div', null, h('label', {for: 't-sort'}, 'Order'), order),
      h('button', {type: 'submit'}, 'Show'));
    const first = data.total ? (page - 1) * PAGE_SIZE + 1 : 0;
    const last = Math.min(data.total, page * PAGE_SIZE);
    const pager = () => h('nav', {class: 'pager', 'aria-label': 'Pages'},
      h('button', {type: 'button', class: 'secondary', disabled: page <= 1, onclick: () => go(page - 1)}, '← Previous'),
      h('span', {class: 'page-info'}, 'Trees ' + num(first) + '–' + num(last) + ' of ' + num(data.total)
        + ' · page ' + page + ' of ' + pages),
      h('button', {type: 'button', class: 'secondary', disabled: page >= pages, onclick: () => go(page + 1)}, 'Next →'));
    return h('section', {'aria-labelledby': 'title'},
      h('h1', {id: 'title'}, 'Provider trees'),
      h('p', {class: 'lead'}, 'Each root provider (a compute node, a shared storage pool…) with its nested providers '
        + '(NUMA cells, GPUs, network functions), their usage per resource class, traits and aggregates.'
        + (search ? ' Trees with a provider matching “' + search + '”.' : '')),
      form, legend(), pager(),
      data.trees.length ? data.trees.map(treeCard) : h('p', {class: 'note'}, 'No tree matches.'),
      data.trees.length > 3 ? pager() : null);
  }

  // -- one provider ------------------------------------------------------------
  async function renderProvider(current) {
    const rp = await api('allotment/capacity/providers/' + encodeURIComponent(current.arg || ''));
    const classes = Object.keys(rp.inventories).sort();
    const inventory = classes.length ? h('div', {class: 'table-wrap'}, h('table', {class: 'inventories stack'},
      h('caption', null, 'Inventories: what this provider offers, and how much of it is allocated'),
      h('thead', null, h('tr', null, ['Resource class', 'Usage', 'Used', 'Free', 'Capacity', 'Total', 'Reserved',
        'Allocation ratio', 'Each allocation'].map((title, i) =>
        h('th', {scope: 'col', class: i > 1 ? 'num' : null}, title)))),
      h('tbody', null, classes.map((rc) => {
        const inv = rp.inventories[rc];
        return h('tr', {'data-rc': rc}, h('th', {scope: 'row'}, rc), h('td', null, bar(rc, inv.used, inv.capacity)),
          ['used', 'free', 'capacity', 'total', 'reserved', 'allocation_ratio']
            .map((field) => h('td', {class: 'num', 'data-field': field,
                                     'data-label': (field[0].toUpperCase() + field.slice(1)).replace('_', ' ')},
              field === 'allocation_ratio' ? String(inv[field]) : amountCell(rc, inv[field]))),
          h('td', {class: 'num', 'data-field': 'units', 'data-label': 'Each allocation', title: 'min_unit ' + inv.min_unit + ', max_unit '
            + inv.max_unit + ', step_size ' + inv.step_size},
            num(inv.min_unit) + ' to ' + num(inv.max_unit), h('span', {class: 'sub'}, 'in steps of ' + num(inv.step_size))));
      })))) : h('p', {class: 'note'}, 'No inventory: this provider offers nothing itself (its children may).');
    const consumers = rp.consumers.length ? h('div', {class: 'table-wrap'}, h('table', {class: 'consumers'},
      h('caption', null, rp.consumers.length + (rp.consumers.length === 1 ? ' consumer holds' : ' consumers hold')
        + ' allocations here, the biggest first'),
      h('thead', null, h('tr', null, ['Consumer', 'Project', 'User', 'Type', 'Allocated here'].map((title) =>
        h('th', {scope: 'col'}, title)))),
      h('tbody', null, rp.consumers.map((c) => h('tr', {'data-consumer': c.consumer},
        h('td', {class: 'mono'}, c.consumer), h('td', {class: 'mono'}, c.project_id || '—'),
        h('td', {class: 'mono'}, c.user_id || '—'), h('td', null, c.consumer_type || 'unknown'),
        h('td', null, Object.keys(c.resources).sort().map((rc) =>
          h('span', {class: 'sub', 'data-rc': rc}, rc + ' ' + amount(rc, c.resources[rc])))))))))
      : h('p', {class: 'note'}, 'No consumer holds allocations on this provider.');
    const sharing = rp.sharing_providers.length ? h('ul', {class: 'sharing'}, rp.sharing_providers.map((s) =>
      h('li', {'data-uuid': s.uuid}, providerLink(s.uuid, s.name), ' — through aggregate ',
        s.aggregates.map(short).join(', '), ': ',
        Object.keys(s.inventories).sort().map((rc) => rc + ' ' + num(s.inventories[rc].free) + ' free').join(', '))))
      : h('p', {class: 'help'}, 'None: no provider with MISC_SHARES_VIA_AGGREGATE shares an aggregate with this provider or its root.');
    return h('section', {'aria-labelledby': 'title'},
      h('p', null, h('a', {href: '#/trees' + query({search: rp.root.uuid})}, '← its tree')),
      h('h1', {id: 'title'}, rp.name),
      h('dl', {class: 'facts'},
        h('dt', null, 'UUID'), h('dd', {class: 'mono'}, rp.uuid),
        h('dt', null, 'Generation'), h('dd', null, String(rp.generation)),
        h('dt', null, 'Parent'), h('dd', null, rp.parent ? providerLink(rp.parent.uuid, rp.parent.name) : 'none: a root provider'),
        h('dt', null, 'Root'), h('dd', null, rp.root.uuid === rp.uuid ? 'itself' : providerLink(rp.root.uuid, rp.root.name)),
        h('dt', null, 'Children'), h('dd', null, rp.children.length
          ? rp.children.map((c, i) => [i ? ', ' : '', providerLink(c.uuid, c.name)]) : 'none')),
      h('h2', null, 'Inventories'), inventory,
      h('h2', null, 'Consumers'), consumers,
      h('h2', null, 'Traits'), chips(rp.traits, 'trait', 'Traits') || h('p', {class: 'help'}, 'None.'),
      h('h2', null, 'Aggregates'), rp.aggregates.length
        ? h('ul', {class: 'aggregates'}, rp.aggregates.map((a) => h('li', {class: 'mono'}, a)))
        : h('p', {class: 'help'}, 'None.'),
      h('h2', null, 'Sharing providers it can use'), sharing);
  }

  // -- projects ----------------------------------------------------------------
  async function renderProjects() {
    const data = await api('allotment/capacity/projects');
    const classes = Object.keys(data.cloud).sort();
    const share = (usages) => Math.max(0, ...classes.map((rc) => (data.cloud[rc].capacity
      ? (usages[rc] || 0) / data.cloud[rc].capacity : 0)));
    const projects = data.projects.slice().sort((a, b) => share(b.usages) - share(a.usages)
      || a.project_id.localeCompare(b.project_id));
    const cells = (usages) => classes.map((rc) => h('td', {class: 'num', 'data-rc': rc},
      usages[rc] ? [amountCell(rc, usages[rc]), h('span', {class: 'sub'},
        pct(usages[rc], data.cloud[rc].capacity) + '% of cloud')] : '—'));
    const body = projects.map((p) => {
      const users = p.users.slice().sort((a, b) => share(b.usages) - share(a.usages));
      const userRows = users.map((u) => h('tr', {class: 'user', hidden: true, 'data-user': u.user_id},
        h('td', {class: 'mono'}, 'user ' + u.user_id), h('td', {class: 'num'}, num(u.consumers)), cells(u.usages)));
      const toggle = h('button', {type: 'button', class: 'toggle', 'aria-expanded': 'false', onclick: () => {
        const open = toggle.getAttribute('aria-expanded') !== 'true';
        toggle.setAttribute('aria-expanded', String(open));
        toggle.firstChild.textContent = open ? '▾ ' : '▸ ';
        for (const row of userRows) row.hidden = !open;
      }}, h('span', {'aria-hidden': 'true'}, '▸ '), users.length + (users.length === 1 ? ' user' : ' users'));
      return h('tbody', {'data-project': p.project_id},
        h('tr', {class: 'project'}, h('th', {scope: 'row'}, h('span', {class: 'mono'}, p.project_id), ' ', toggle),
          h('td', {class: 'num', 'data-field': 'consumers'}, num(p.consumers)), cells(p.usages)),
        userRows);
    });
    return h('section', {'aria-labelledby': 'title'},
      h('h1', {id: 'title'}, 'Usage per project'),
      h('p', {class: 'lead'}, 'What each project (and each of its users) holds, as GET /usages reports it. '
        + 'Biggest first: by the largest share of the cloud’s capacity of any resource class.'),
      projects.length ? h('div', {class: 'table-wrap'}, h('table', {class: 'projects'},
        h('caption', null, projects.length + ' projects hold allocations'),
        h('thead', null, h('tr', null, h('th', {scope: 'col'}, 'Project'), h('th', {scope: 'col', class: 'num'}, 'Consumers'),
          classes.map((rc) => h('th', {scope: 'col', class: 'num'}, rc)))),
        body)) : h('p', {class: 'note'}, 'No project holds allocations.'));
  }

  // -- why doesn't it fit? -----------------------------------------------------
  let fitForm = null;
  function groupFieldset(suffix, values) {
    const id = (name) => 'g' + (suffix || '0') + '-' + name;
    const field = (name, label, placeholder, help) => h('div', {class: 'field'},
      h('label', {for: id(name)}, label),
      h('input', {id: id(name), name: name + suffix, value: (values && values[name + suffix]) || '', placeholder,
                  'aria-describedby': help ? id(name) + '-help' : null}),
      help ? h('span', {class: 'help', id: id(name) + '-help'}, help) : null);
    return h('fieldset', {'data-suffix': suffix},
      h('legend', null, suffix ? 'Request group ' + suffix + ' (granular: one provider serves it)' : 'Resources of the request'),
      field('resources', 'Resources', 'VCPU:2,MEMORY_MB:4096', 'CLASS:AMOUNT, separated by commas'),
      field('required', 'Traits', 'HW_CPU_X86_AVX2,!CUSTOM_MAINTENANCE', '! in front forbids; in:A,B means any of'),
      field('member_of', 'Aggregates (member_of)', 'in:AGG_UUID,AGG_UUID', '! in front: not in it'),
      suffix ? null : field('in_tree', 'Only in the tree of', 'root provider UUID', null));
  }
  function renderFit(current) {
    const values = current.params;
    const suffixes = Object.keys(values).filter((k) => /^resources[A-Za-z0-9_-]+$/.test(k))
      .map((k) => k.slice('resources'.length));
    const groups = h('div', {class: 'groups'}, groupFieldset('', values),
      suffixes.map((s) => groupFieldset(s, values)));
    let next = suffixes.length + 1;
    const policy = h('select', {id: 'fit-policy', name: 'group_policy'},
      ['', 'none', 'isolate'].map((v) => h('option', {value: v, selected: (values.group_policy || '') === v},
        v || '(not set)')));
    const limit = h('input', {id: 'fit-limit', name: 'limit', type: 'number', min: '1', max: '1000',
                              value: values.limit || '10'});
    const result = h('div', {id: 'fit-result', 'aria-live': 'polite'});
    fitForm = h('form', {class: 'fit-form', 'aria-label': 'Allocation candidates query', onsubmit: (event) => {
      event.preventDefault();
      const params = {};
      for (const input of fitForm.querySelectorAll('input, select')) {
        if (input.name && input.value.trim()) params[input.name] = input.value.trim();
      }
      location.hash = '#/fit' + query(params);
    }},
      groups,
      h('div', {class: 'field'}, h('label', {for: 'fit-policy'}, 'Group policy'), policy,
        h('span', {class: 'help'}, 'Needed with two or more groups')),
      h('div', {class: 'field'}, h('label', {for: 'fit-limit'}, 'Show at most'), limit),
      h('div', {class: 'actions'},
        h('button', {type: 'button', class: 'secondary', onclick: () => {
          groups.append(groupFieldset(String(next++), {}));
        }}, 'Add a request group'),
        h('button', {type: 'submit'}, 'Find candidates')));
    const section = h('section', {'aria-labelledby': 'title'},
      h('h1', {id: 'title'}, 'Why doesn’t it fit?'),
      h('p', {class: 'lead'}, 'Ask what the scheduler asks (GET /allocation_candidates). When nothing fits, '
        + 'the explanation says which filter removed which trees, and what the closest trees lack.'),
      fitForm, result);
    const asked = Object.fromEntries(Object.entries(values).filter(([, v]) => v !== ''));
    if (Object.keys(asked).some((k) => k.startsWith('resources'))) return fillFit(section, result, asked);
    return section;
  }
  async function fillFit(section, result, params) {
    const qs = query(params);
    const lines = [h('p', null, 'Query: ', h('code', {class: 'query'}, 'GET /allocation_candidates' + qs))];
    let data;
    try {
      data = await api('allocation_candidates' + qs);
    } catch (error) {
      if (error instanceof AuthError) throw error;
      result.replaceChildren(...lines, h('p', {class: 'alert', role: 'alert', 'data-outcome': 'error'},
        'The request was refused: ' + error.message));
      return section;
    }
    const found = data.allocation_requests.length;
    if (found) {
      const uuids = new Set();
      for (const request of data.allocation_requests) Object.keys(request.allocations).forEach((u) => uuids.add(u));
      const names = {};
      const known = await api('allotment/capacity/providers' + query({uuid: Array.from(uuids).join(',')}));
      for (const p of known.providers) names[p.uuid] = p;
      const rows = data.allocation_requests.map((request, i) => h('tr', null, h('td', {class: 'num'}, String(i + 1)),
        h('td', null, Object.entries(request.allocations).map(([uuid, a]) => h('span', {class: 'sub'},
          providerLink(uuid, names[uuid] ? names[uuid].name : uuid),
          names[uuid] && names[uuid].root.uuid !== uuid ? ' (in ' + names[uuid].root.name + ')' : '', ': ',
          Object.entries(a.resources).map(([rc, n]) => rc + ' ' + num(n)).join(', '))))));
      result.replaceChildren(...lines,
        h('p', {class: 'verdict', 'data-outcome': 'candidates'}, 'It fits: ' + found
          + (found === 1 ? ' candidate' : ' candidates') + (params.limit ? ' (at most ' + params.limit + ' asked for)' : '') + '.'),
        h('div', {class: 'table-wrap'}, h('table', {class: 'candidates'},
          h('caption', null, 'Where the request could be placed: each row is one allocation the scheduler could claim'),
          h('thead', null, h('tr', null, h('th', {scope: 'col', class: 'num'}, '#'),
            h('th', {scope: 'col'}, 'Providers and amounts'))),
          h('tbody', null, rows))));
      return section;
    }
    const report = await api('allotment/explain' + qs);
    result.replaceChildren(...lines, explanation(report));
    return section;
  }
  function explanation(report) {
    const counts = (c) => (c ? num(c.left) + ' left, ' + num(c.eliminated) + ' removed' : '');
    return h('div', {class: 'explain', 'data-outcome': 'explain'},
      h('p', {class: 'verdict'}, 'It does not fit. ', report.verdict),
      h('h2', null, 'Filter by filter'),
      h('div', {class: 'table-wrap'}, h('table', {class: 'steps'},
        h('caption', null, 'In the order they apply; of ' + num(report.cloud.trees) + ' trees and '
          + num(report.cloud.providers) + ' providers'),
        h('thead', null, h('tr', null, h('th', {scope: 'col'}, 'Filter'), h('th', {scope: 'col'}, 'Group'),
          h('th', {scope: 'col'}, 'Providers'), h('th', {scope: 'col'}, 'Trees'))),
        h('tbody', null, report.steps.map((step) => h('tr', null, h('td', null, step.label),
          h('td', null, step.group === null ? '' : (step.group === '' ? 'unsuffixed' : step.group)),
          h('td', null, counts(step.providers)), h('td', null, counts(step.trees))))))),
      report.reasons.length ? [h('h2', null, 'Why trees were removed'), h('ul', {class: 'reasons'},
        report.reasons.map((r) => h('li', null, r.reason + ': ' + num(r.trees) + (r.trees === 1 ? ' tree' : ' trees'))))] : null,
      report.closest.length ? [h('h2', null, 'Closest trees and what they lack'), h('ol', {class: 'closest'},
        report.closest.map((c) => h('li', null, c.tree && c.tree.uuid ? providerLink(c.tree.uuid, c.tree.name) : 'a tree',
          h('ul', {class: 'problems'}, c.problems.map((p) => h('li', null, p.text))))))] : null,
      report.notes.length ? h('ul', {class: 'notes'}, report.notes.map((n) => h('li', {class: 'note'}, n))) : null);
  }

  render();
})();
