"""Read-only queries for the capacity view (``/allotment/capacity...``).

What the Placement API cannot give cheaply, each in a few statements
whatever the size of the cloud:

* ``overview``: the cloud's (or one aggregate's, or one trait's) sums per
  resource class, with provider, root and consumer counts, and the
  aggregates and traits there are to filter by.  The sums come from
  :func:`allotment.db.resource_totals.filtered_sums`, the query behind the
  capacity gauges of ``GET /metrics``, so the two never disagree.
* ``tree_page``: one page of provider trees (roots matching a search,
  sorted by name or by fullness, paged in SQL), each with every provider
  of the tree, its inventories with usage, traits and aggregates.
* ``provider_detail``: one provider, its inventories, the consumers
  holding allocations on it, its aggregates and traits, the sharing
  providers it can reach.
* ``project_usages``: allocations summed per project, user and class.
* ``provider_names``: uuid -> name (and root) of a few providers.

A provider belongs to an aggregate, or has a trait, for the filters when it
or its root does (an aggregate or trait on a compute node speaks for its
tree, as ``member_of`` has it for aggregates).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import raw_rows, resource_totals, tables
from allotment.domain import inventory_fit as rules

RP = tables.resource_providers
INV = tables.inventories
RC = tables.resource_classes
ALLOC = tables.allocations
AGG = tables.placement_aggregates
RP_AGG = tables.resource_provider_aggregates
TRAIT = tables.traits
RP_TRAIT = tables.resource_provider_traits
CONSUMERS = tables.consumers
PROJECTS = tables.projects
USERS = tables.users
TYPES = tables.consumer_types

SHARING_TRAIT = "MISC_SHARES_VIA_AGGREGATE"


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _in_aggregate(aggregate_uuid: str) -> sa.Select:
    """Ids of the providers in an aggregate, or whose root is."""
    agg_ids = sa.select(AGG.c.id).where(AGG.c.uuid == aggregate_uuid)
    members = sa.select(RP_AGG.c.resource_provider_id).where(RP_AGG.c.aggregate_id.in_(agg_ids))
    return sa.select(RP.c.id).where(sa.or_(RP.c.id.in_(members), RP.c.root_provider_id.in_(members)))


def _with_trait(trait: str) -> sa.Select:
    """Ids of the providers having a trait, or whose root has it."""
    trait_ids = sa.select(TRAIT.c.id).where(TRAIT.c.name == trait)
    holders = sa.select(RP_TRAIT.c.resource_provider_id).where(RP_TRAIT.c.trait_id.in_(trait_ids))
    return sa.select(RP.c.id).where(sa.or_(RP.c.id.in_(holders), RP.c.root_provider_id.in_(holders)))


def _selected(aggregate: str | None, trait: str | None) -> sa.Select | None:
    conditions = []
    if aggregate:
        conditions.append(RP.c.id.in_(_in_aggregate(aggregate)))
    if trait:
        conditions.append(RP.c.id.in_(_with_trait(trait)))
    if not conditions:
        return None
    return sa.select(RP.c.id).where(*conditions)


def _sums_json(sums: resource_totals.Sums) -> dict:
    return {"total": sums.total, "reserved": sums.reserved, "capacity": sums.capacity, "used": sums.used,
            "free": sums.capacity - sums.used}


def overview(conn: Connection, aggregate: str | None = None, trait: str | None = None) -> dict:
    selected = _selected(aggregate, trait)
    sums = resource_totals.filtered_sums(conn, selected)
    count_rp = sa.select(sa.func.count(), sa.func.count(sa.case((RP.c.id == RP.c.root_provider_id, 1))))
    count_consumers = sa.select(sa.func.count(sa.distinct(ALLOC.c.consumer_id)))
    if selected is not None:
        count_rp = count_rp.where(RP.c.id.in_(selected))
        count_consumers = count_consumers.where(ALLOC.c.resource_provider_id.in_(selected))
    providers, roots = conn.execute(count_rp.select_from(RP)).one()
    consumers = conn.execute(count_consumers).scalar_one()
    aggregates = conn.execute(
        sa.select(AGG.c.uuid, sa.func.count(RP_AGG.c.resource_provider_id))
        .join(RP_AGG, RP_AGG.c.aggregate_id == AGG.c.id)
        .group_by(AGG.c.uuid).order_by(AGG.c.uuid)).all()
    per_trait = (sa.select(RP_TRAIT.c.trait_id, sa.func.count().label("n"))
                 .group_by(RP_TRAIT.c.trait_id).subquery())  # on the trait_id index alone
    traits = conn.execute(sa.select(TRAIT.c.name, per_trait.c.n)
                          .join(per_trait, per_trait.c.trait_id == TRAIT.c.id).order_by(TRAIT.c.name)).all()
    return {
        "filter": {"member_of": aggregate, "trait": trait},
        "resource_classes": [dict(resource_class=rc, **_sums_json(found)) for rc, found in sorted(sums.items())],
        "providers": int(providers), "roots": int(roots or 0), "consumers": int(consumers),
        "aggregates": [{"uuid": uuid, "providers": int(n)} for uuid, n in aggregates],
        "traits": [{"name": name, "providers": int(n)} for name, n in traits],
    }


def _fullness_by_root() -> sa.Subquery:
    """root id -> the highest used / capacity of any class summed over its tree
    (the unrounded capacity: it only orders the trees).  Capacity and usage
    are grouped per (root, class) apart, then joined: cheaper than joining
    every inventory record to its usage."""
    cap = (sa.select(RP.c.root_provider_id.label("root"), INV.c.resource_class_id.label("rc"),
                     sa.func.sum((INV.c.total - INV.c.reserved) * INV.c.allocation_ratio).label("cap"))
           .select_from(INV.join(RP, RP.c.id == INV.c.resource_provider_id))
           .group_by(RP.c.root_provider_id, INV.c.resource_class_id)
           .subquery())
    used = (sa.select(RP.c.root_provider_id.label("root"), ALLOC.c.resource_class_id.label("rc"),
                      sa.func.sum(ALLOC.c.used).label("used"))
            .select_from(ALLOC.join(RP, RP.c.id == ALLOC.c.resource_provider_id))
            .group_by(RP.c.root_provider_id, ALLOC.c.resource_class_id)
            .subquery())
    ratio = sa.case((cap.c.cap > 0, sa.func.coalesce(used.c.used, 0) * 1.0 / cap.c.cap), else_=0.0)
    return (sa.select(cap.c.root, sa.func.max(ratio).label("fullness"))
            .select_from(cap.outerjoin(used, sa.and_(used.c.root == cap.c.root, used.c.rc == cap.c.rc)))
            .group_by(cap.c.root).subquery())


def tree_page(conn: Connection, search: str | None, sort: str, limit: int, offset: int) -> dict:
    """Roots matching ``search`` (any provider of the tree whose name
    contains it or whose uuid starts with it, case-insensitive), sorted by
    ``name`` or ``fullness`` (fullest first), ``limit`` from ``offset``."""
    roots = sa.select(RP.c.id).where(RP.c.id == RP.c.root_provider_id)
    if search:
        text = _escape_like(search.lower())
        hits = sa.select(RP.c.root_provider_id).where(sa.or_(
            sa.func.lower(RP.c.name).like(f"%{text}%", escape="\\"),
            sa.func.lower(RP.c.uuid).like(f"{text}%", escape="\\")))
        roots = roots.where(RP.c.id.in_(hits))
    total = conn.execute(sa.select(sa.func.count()).select_from(roots.subquery())).scalar_one()
    page = sa.select(RP.c.id).where(RP.c.id.in_(roots))
    if sort == "fullness":
        fullness = _fullness_by_root()
        page = (page.outerjoin(fullness, fullness.c.root == RP.c.id)
                .order_by(sa.func.coalesce(fullness.c.fullness, 0.0).desc(), RP.c.name))
    else:
        page = page.order_by(RP.c.name)
    root_ids = [row[0] for row in conn.execute(page.limit(limit).offset(offset))]
    providers = _providers_of_trees(conn, root_ids)
    by_root: dict[int, list[dict]] = defaultdict(list)
    for provider in providers:
        by_root[provider.pop("root_id")].append(provider)
    trees = []
    for root_id in root_ids:
        members = by_root.get(root_id, [])
        trees.append({"root": members[0]["uuid"] if members else None, "name": members[0]["name"] if members else None,
                      "fullness": _tree_fullness(members), "providers": members})
    return {"total": int(total), "offset": offset, "limit": limit, "sort": sort, "search": search or "",
            "trees": trees}


def _tree_fullness(members: list[dict]) -> float:
    used: dict[str, int] = defaultdict(int)
    cap: dict[str, int] = defaultdict(int)
    for provider in members:
        for rc, inv in provider["inventories"].items():
            used[rc] += inv["used"]
            cap[rc] += inv["capacity"]
    return round(max((used[rc] / cap[rc] for rc in cap if cap[rc] > 0), default=0.0), 4)


# The per-provider reads of the tree and provider pages, by a list of ids
# (or aggregate uuids) as long as a tree is large: raw_rows.rows_in_parts
# splits it for SQLite's parameter limit.
_IDS = sa.bindparam("ids", expanding=True)
_USAGE = resource_totals.usage_cte()
_INVENTORY_ROWS = (sa.select(INV.c.resource_provider_id, RC.c.name, INV.c.total, INV.c.reserved, INV.c.min_unit,
                             INV.c.max_unit, INV.c.step_size, INV.c.allocation_ratio,
                             sa.func.coalesce(_USAGE.c.used, 0))
                   .select_from(resource_totals.inventories_with_usage(_USAGE))
                   .where(INV.c.resource_provider_id.in_(_IDS)))
_TRAIT_ROWS = (sa.select(RP_TRAIT.c.resource_provider_id, TRAIT.c.name)
               .join(TRAIT, TRAIT.c.id == RP_TRAIT.c.trait_id)
               .where(RP_TRAIT.c.resource_provider_id.in_(_IDS))
               .order_by(TRAIT.c.name))
_AGGREGATE_ROWS = (sa.select(RP_AGG.c.resource_provider_id, AGG.c.uuid)
                   .join(AGG, AGG.c.id == RP_AGG.c.aggregate_id)
                   .where(RP_AGG.c.resource_provider_id.in_(_IDS))
                   .order_by(AGG.c.uuid))
_SHARING_ROWS = (sa.select(RP.c.id, RP.c.uuid, RP.c.name, AGG.c.uuid)
                 .join(RP_AGG, RP_AGG.c.resource_provider_id == RP.c.id)
                 .join(AGG, AGG.c.id == RP_AGG.c.aggregate_id)
                 .join(RP_TRAIT, RP_TRAIT.c.resource_provider_id == RP.c.id)
                 .join(TRAIT, TRAIT.c.id == RP_TRAIT.c.trait_id)
                 .where(TRAIT.c.name == SHARING_TRAIT, AGG.c.uuid.in_(_IDS), RP.c.id != sa.bindparam("pid"))
                 .order_by(RP.c.name, AGG.c.uuid))


def _inventory_rows(conn: Connection, provider_ids: Sequence[int]) -> dict[int, dict[str, dict]]:
    rows = raw_rows.rows_in_parts(conn, _INVENTORY_ROWS, {"ids": list(provider_ids)})
    found: dict[int, dict[str, dict]] = defaultdict(dict)
    for pid, rc, total, reserved, min_unit, max_unit, step, ratio, used in rows:
        cap = rules.capacity(total, reserved, ratio)
        found[pid][rc] = {"total": total, "reserved": reserved, "min_unit": min_unit, "max_unit": max_unit,
                          "step_size": step, "allocation_ratio": ratio, "capacity": cap, "used": int(used),
                          "free": cap - int(used)}
    return found


def _traits_of(conn: Connection, provider_ids: Sequence[int]) -> dict[int, list[str]]:
    found: dict[int, list[str]] = defaultdict(list)
    for pid, name in raw_rows.rows_in_parts(conn, _TRAIT_ROWS, {"ids": list(provider_ids)}):
        found[pid].append(name)
    return found


def _aggregates_of(conn: Connection, provider_ids: Sequence[int]) -> dict[int, list[str]]:
    found: dict[int, list[str]] = defaultdict(list)
    for pid, uuid in raw_rows.rows_in_parts(conn, _AGGREGATE_ROWS, {"ids": list(provider_ids)}):
        found[pid].append(uuid)
    return found


def _providers_of_trees(conn: Connection, root_ids: Sequence[int]) -> list[dict]:
    """Every provider of the trees, each tree parents first (root first)."""
    if not root_ids:
        return []
    parent = RP.alias("parent")
    rows = conn.execute(sa.select(RP.c.id, RP.c.uuid, RP.c.name, RP.c.generation, RP.c.root_provider_id,
                                  RP.c.parent_provider_id, parent.c.uuid)
                        .outerjoin(parent, parent.c.id == RP.c.parent_provider_id)
                        .where(RP.c.root_provider_id.in_(root_ids))).all()
    ids = [row[0] for row in rows]
    inventories = _inventory_rows(conn, ids)
    traits = _traits_of(conn, ids)
    aggregates = _aggregates_of(conn, ids)
    children: dict[int | None, list] = defaultdict(list)
    for row in rows:
        children[row[5]].append(row)
    ordered: list[dict] = []

    def visit(row, depth: int) -> None:
        pid = row[0]
        ordered.append({"uuid": row[1], "name": row[2], "generation": row[3], "root_id": row[4],
                        "parent": row[6], "depth": depth, "inventories": inventories.get(pid, {}),
                        "traits": traits.get(pid, []), "aggregates": aggregates.get(pid, [])})
        for child in sorted(children.get(pid, []), key=lambda r: r[2]):
            visit(child, depth + 1)

    for row in sorted(children.get(None, []), key=lambda r: r[2]):
        visit(row, 0)
    return ordered


def provider_detail(conn: Connection, uuid: str) -> dict | None:
    parent, root = RP.alias("parent"), RP.alias("root")
    row = conn.execute(sa.select(RP.c.id, RP.c.uuid, RP.c.name, RP.c.generation, RP.c.root_provider_id,
                                 parent.c.uuid, parent.c.name, root.c.uuid, root.c.name)
                       .outerjoin(parent, parent.c.id == RP.c.parent_provider_id)
                       .outerjoin(root, root.c.id == RP.c.root_provider_id)
                       .where(RP.c.uuid == uuid)).first()
    if row is None:
        return None
    pid, root_id = row[0], row[4]
    children = conn.execute(sa.select(RP.c.uuid, RP.c.name).where(RP.c.parent_provider_id == pid)
                            .order_by(RP.c.name)).all()
    consumers: dict[str, dict] = {}
    for consumer, rc, used, project, user, ctype in conn.execute(
            sa.select(ALLOC.c.consumer_id, RC.c.name, ALLOC.c.used, PROJECTS.c.external_id,
                      USERS.c.external_id, TYPES.c.name)
            .join(RC, RC.c.id == ALLOC.c.resource_class_id)
            .outerjoin(CONSUMERS, CONSUMERS.c.uuid == ALLOC.c.consumer_id)
            .outerjoin(PROJECTS, PROJECTS.c.id == CONSUMERS.c.project_id)
            .outerjoin(USERS, USERS.c.id == CONSUMERS.c.user_id)
            .outerjoin(TYPES, TYPES.c.id == CONSUMERS.c.consumer_type_id)
            .where(ALLOC.c.resource_provider_id == pid)):
        entry = consumers.setdefault(consumer, {"consumer": consumer, "project_id": project, "user_id": user,
                                                "consumer_type": ctype, "resources": {}})
        entry["resources"][rc] = entry["resources"].get(rc, 0) + int(used)
    aggregates = _aggregates_of(conn, [pid]).get(pid, [])
    tree_aggregates = set(aggregates) | set(_aggregates_of(conn, [root_id]).get(root_id, []))
    return {
        "uuid": row[1], "name": row[2], "generation": row[3],
        "parent": {"uuid": row[5], "name": row[6]} if row[5] else None,
        "root": {"uuid": row[7], "name": row[8]},
        "children": [{"uuid": u, "name": n} for u, n in children],
        "inventories": _inventory_rows(conn, [pid]).get(pid, {}),
        "traits": _traits_of(conn, [pid]).get(pid, []),
        "aggregates": aggregates,
        "consumers": sorted(consumers.values(), key=lambda c: (-sum(c["resources"].values()), c["consumer"])),
        "sharing_providers": _sharing(conn, pid, sorted(tree_aggregates)),
    }


def _sharing(conn: Connection, pid: int, aggregates: list[str]) -> list[dict]:
    """Providers with MISC_SHARES_VIA_AGGREGATE in an aggregate of the
    provider or its root: where its tree may borrow from."""
    if not aggregates:
        return []
    rows = raw_rows.rows_in_parts(conn, _SHARING_ROWS, {"ids": list(aggregates), "pid": pid})
    if len(aggregates) > raw_rows.IDS_PER_STATEMENT:  # parts, each in order: in order together
        rows.sort(key=lambda row: (row[2], row[3]))
    found: dict[int, dict] = {}
    for sid, uuid, name, agg in rows:
        found.setdefault(sid, {"uuid": uuid, "name": name, "aggregates": []})["aggregates"].append(agg)
    inventories = _inventory_rows(conn, list(found))
    for sid, entry in found.items():
        entry["inventories"] = inventories.get(sid, {})
    return list(found.values())


def project_usages(conn: Connection) -> list[dict]:
    """Per project: usages per class, consumers, and the same per user."""
    joined = (ALLOC.join(CONSUMERS, CONSUMERS.c.uuid == ALLOC.c.consumer_id)
              .join(PROJECTS, PROJECTS.c.id == CONSUMERS.c.project_id)
              .join(USERS, USERS.c.id == CONSUMERS.c.user_id)
              .join(RC, RC.c.id == ALLOC.c.resource_class_id))
    sums = conn.execute(sa.select(PROJECTS.c.external_id, USERS.c.external_id, RC.c.name, sa.func.sum(ALLOC.c.used))
                        .select_from(joined)
                        .group_by(PROJECTS.c.external_id, USERS.c.external_id, RC.c.name)).all()
    counts = conn.execute(sa.select(PROJECTS.c.external_id, USERS.c.external_id,
                                    sa.func.count(sa.distinct(CONSUMERS.c.id)))
                          .select_from(joined)
                          .group_by(PROJECTS.c.external_id, USERS.c.external_id)).all()
    projects: dict[str, dict] = {}

    def user_entry(project: str, user: str) -> dict:
        entry = projects.setdefault(project, {"project_id": project, "usages": {}, "consumers": 0, "users": {}})
        return entry["users"].setdefault(user, {"user_id": user, "usages": {}, "consumers": 0})

    for project, user, rc, used in sums:
        user_entry(project, user)["usages"][rc] = int(used)
        usages = projects[project]["usages"]
        usages[rc] = usages.get(rc, 0) + int(used)
    for project, user, consumers in counts:
        user_entry(project, user)["consumers"] = int(consumers)
        projects[project]["consumers"] += int(consumers)
    result = []
    for entry in projects.values():
        entry["users"] = list(entry["users"].values())
        result.append(entry)
    return result


def provider_names(conn: Connection, uuids: Sequence[str]) -> list[dict]:
    root = RP.alias("root")
    rows = conn.execute(sa.select(RP.c.uuid, RP.c.name, root.c.uuid, root.c.name)
                        .outerjoin(root, root.c.id == RP.c.root_provider_id)
                        .where(RP.c.uuid.in_(list(uuids))).order_by(RP.c.name)).all()
    return [{"uuid": u, "name": n, "root": {"uuid": ru, "name": rn}} for u, n, ru, rn in rows]
