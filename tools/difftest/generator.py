"""Random request streams for the differential test, driven by a model.

The model records what the stream has (probably) created: providers and
their trees, custom resource classes, traits, aggregates, consumers with
their generations, projects and users.  It is updated from the reference
server's answers (``Model.observe``), so most requests are valid and
reach deep into the API; a share of each stream is deliberately invalid
(bad bodies, unknown uuids, stale generations, wrong methods, bad
microversion or Accept headers, no token).

A request is a plain dict (``method``, ``path``, ``headers``, ``body``
bytes or None) so a stream can be replayed, shrunk and printed.
"""

from __future__ import annotations

import json
import random
import uuid as uuidlib
from urllib.parse import quote, urlencode

MAX_MINOR = 39
STANDARD_CLASSES = ["VCPU", "MEMORY_MB", "DISK_GB", "IPV4_ADDRESS", "SRIOV_NET_VF", "PCPU"]
STANDARD_TRAITS = ["HW_CPU_X86_AVX", "HW_CPU_X86_SSE", "STORAGE_DISK_SSD", "COMPUTE_VOLUME_MULTI_ATTACH",
                   "HW_NIC_SRIOV", "MISC_SHARES_VIA_AGGREGATE"]
METHODS = ["GET", "PUT", "POST", "DELETE", "PATCH", "HEAD"]


def mv(minor: int) -> tuple[int, int]:
    return (1, minor)


class Profile:
    """Which request shapes a run may emit.

    The in-suite profile (``suite=True``) may leave out the shapes of a
    known divergence that another change is fixing: give each such shape a
    flag here (True in the full profile), say why, and drop it once the fix
    is merged.  None is left out at present: every data-level divergence
    of issue 9 the flags once covered is fixed.
    """

    def __init__(self, *, suite: bool = False):
        self.suite = suite


class Model:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.providers: dict[str, dict] = {}  # uuid -> {name, parent, root, generation}
        self.custom_classes: set[str] = set()
        self.custom_traits: set[str] = set()
        self.aggregates: list[str] = [str(uuidlib.UUID(int=rng.getrandbits(128))) for _ in range(4)]
        self.consumers: dict[str, int | None] = {}  # uuid -> generation (None: unknown/new)
        # uuid -> {provider: {class: amount}} as last seen or written (for reshapes that move them).
        self.holdings: dict[str, dict[str, dict[str, int]]] = {}
        # New consumers whose first write failed, in the order seen (a dict: ordered).
        self.refused_consumers: dict[str, None] = {}
        self.projects = ["proj-a", "proj-b", "proj-c"]
        self.users = ["user-a", "user-b"]
        self.counter = 0

    def new_uuid(self) -> str:
        return str(uuidlib.UUID(int=self.rng.getrandbits(128), version=4))

    def provider(self) -> str | None:
        # In creation order: a uuid the reference generated must not decide
        # the pick, or the same seed would give another stream on every run.
        return self.rng.choice(list(self.providers)) if self.providers else None

    def classes(self) -> list[str]:
        return STANDARD_CLASSES[:3] + sorted(self.custom_classes)

    def traits(self) -> list[str]:
        return STANDARD_TRAITS + sorted(self.custom_traits)

    # -- learning from the reference's answers ------------------------------
    def observe(self, request: dict, status: int, headers: dict, body) -> None:
        method, path = request["method"], request["path"].split("?")[0]
        parts = path.strip("/").split("/")
        sent = request.get("json")
        ok = 200 <= status < 300
        if parts[0] == "resource_providers":
            if len(parts) == 1 and method == "POST" and ok:
                location = headers.get("location", "")
                new = location.rsplit("/", 1)[-1] if location else (body or {}).get("uuid")
                if new:
                    parent = (sent or {}).get("parent_provider_uuid")
                    root = self.providers.get(parent, {}).get("root", new) if parent else new
                    self.providers[new] = {"name": (sent or {}).get("name"), "parent": parent,
                                           "root": root, "generation": 0,
                                           "traits": [], "aggregates": [], "inventories": []}
            elif len(parts) >= 2:
                rp = parts[1]
                if status == 404 and rp in self.providers and len(parts) == 2:
                    self.providers.pop(rp, None)
                if len(parts) == 2 and method == "DELETE" and ok:
                    self.providers.pop(rp, None)
                if len(parts) == 3 and parts[2] == "traits" and method == "DELETE" and ok and rp in self.providers:
                    self.providers[rp]["traits"] = []
                if isinstance(body, dict) and rp in self.providers:
                    generation = body.get("resource_provider_generation", body.get("generation"))
                    if isinstance(generation, int):
                        self.providers[rp]["generation"] = generation
                    if len(parts) == 3 and parts[2] == "inventories" and isinstance(body.get("inventories"), dict):
                        self.providers[rp]["inventories"] = sorted(body["inventories"])
                    if len(parts) >= 3 and parts[2] == "inventories" and method in ("POST", "DELETE") and ok:
                        self.providers[rp].pop("inventories", None)  # unknown until read
                    for key in ("traits", "aggregates"):
                        if len(parts) == 3 and parts[2] == key and isinstance(body.get(key), list):
                            self.providers[rp][key] = sorted(body[key])
                    if len(parts) == 2 and "root_provider_uuid" in body:
                        self.providers[rp]["root"] = body["root_provider_uuid"]
                        self.providers[rp]["parent"] = body.get("parent_provider_uuid")
        elif parts[0] == "resource_classes" and ok:
            name = parts[1] if len(parts) > 1 else (sent or {}).get("name")
            if name and name.startswith("CUSTOM_"):
                (self.custom_classes.discard if method == "DELETE" else self.custom_classes.add)(name)
        elif parts[0] == "traits" and len(parts) > 1 and ok and parts[1].startswith("CUSTOM_"):
            (self.custom_traits.discard if method == "DELETE" else self.custom_traits.add)(parts[1])
        elif parts[0] == "allocations":
            if len(parts) == 2:
                consumer = parts[1]
                if method == "GET" and ok and isinstance(body, dict):
                    self.consumers[consumer] = body.get("consumer_generation")
                    if isinstance(body.get("allocations"), dict):
                        self.hold(consumer, body["allocations"])
                elif method == "PUT" and not ok and consumer not in self.consumers:
                    self.refused_consumers[consumer] = None
                elif method in ("PUT", "DELETE") and ok:
                    self.consumers[consumer] = None  # learn it from the next GET
                    self.touched(self.holdings.get(consumer, {}))
                    if method == "DELETE":
                        self.consumers.pop(consumer, None)
                        self.holdings.pop(consumer, None)
                    elif isinstance((sent or {}).get("allocations"), dict):
                        self.touched(sent["allocations"])
                        self.hold(consumer, sent["allocations"])
            elif method == "POST" and ok:
                for consumer, entry in (sent or {}).items():
                    self.consumers[consumer] = None
                    self.touched(self.holdings.get(consumer, {}))
                    if isinstance(entry, dict) and isinstance(entry.get("allocations"), dict):
                        self.touched(entry["allocations"])
                        self.hold(consumer, entry["allocations"])
            elif method == "POST" and isinstance(sent, dict):
                self.refused_consumers.update((c, None) for c in sent if c not in self.consumers)
        elif parts[0] == "reshaper" and isinstance(sent, dict):
            if ok:
                for rp in sent.get("inventories") or {}:
                    if rp in self.providers:
                        self.providers[rp].pop("inventories", None)  # unknown until read
                        self.providers[rp]["generation"] = None
                for consumer, entry in (sent.get("allocations") or {}).items():
                    self.consumers[consumer] = None
                    self.touched(self.holdings.get(consumer, {}))
                    self.touched(entry.get("allocations") or {})
                    self.hold(consumer, entry.get("allocations") or {})
            elif status == 400 and "that does not exist" in json.dumps(body):
                # Refused for an unknown provider in the allocations: new consumers stay.
                self.refused_consumers.update((c, None) for c in sent.get("allocations") or {}
                                              if c not in self.consumers)
        for ref in self.providers.values():
            ref.setdefault("generation", 0)

    def touched(self, providers) -> None:
        """An allocation write may have moved these providers' generations: unknown until read."""
        for rp in providers:
            if rp in self.providers:
                self.providers[rp]["generation"] = None

    def hold(self, consumer: str, allocations: dict) -> None:
        """Record a consumer's allocations ({provider: {"resources": {...}}}); empty: none."""
        held = {rp: dict(entry["resources"]) for rp, entry in allocations.items()
                if isinstance(entry, dict) and isinstance(entry.get("resources"), dict)}
        if held:
            self.holdings[consumer] = held
        else:
            self.holdings.pop(consumer, None)


class Generator:
    def __init__(self, seed: int, versions: tuple[int, int] = (0, MAX_MINOR), profile: Profile | None = None):
        self.rng = random.Random(seed)
        self.model = Model(self.rng)
        self.low, self.high = versions
        self.profile = profile or Profile()
        self.actions = [
            (8, self.create_provider), (4, self.show_provider), (3, self.update_provider),
            (2, self.delete_provider), (4, self.list_providers),
            (7, self.set_inventories), (3, self.inventory_item), (2, self.get_inventories),
            (3, self.aggregates), (4, self.provider_traits),
            (3, self.resource_classes), (3, self.traits),
            (8, self.put_allocations), (3, self.get_allocations), (2, self.delete_allocations),
            (3, self.post_allocations), (6, self.allocation_candidates), (3, self.usages),
            (4, self.reshaper), (5, self.noise),
        ]
        self.total = sum(weight for weight, _ in self.actions)
        self.planned_move: tuple | None = None  # a reshape waiting for a generation read
        self.script: list = []  # the next requests of a reshape scene (callables)


    # -- helpers -------------------------------------------------------------
    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def version(self, at_least: int = 0) -> tuple[int, int]:
        low = max(self.low, at_least) if self.chance(0.9) else self.low
        return mv(self.rng.randint(low, max(low, self.high)))

    def request(self, method: str, path: str, version, body=None, *, raw: bytes | None = None,
                headers: dict | None = None, token: str | None = "admin") -> dict:
        hdrs = {}
        if token is not None:
            hdrs["X-Auth-Token"] = token
        if version is not None:
            hdrs["OpenStack-API-Version"] = f"placement {version[0]}.{version[1]}" \
                if isinstance(version, tuple) else version
        request = {"method": method, "path": path, "headers": hdrs, "body": None}
        if body is not None:
            request["json"] = body
            request["body"] = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        if raw is not None:
            request["body"] = raw
            hdrs["Content-Type"] = "application/json"
        if headers:
            hdrs.update(headers)
        return request

    def rp(self) -> str:
        """A provider uuid: mostly one that exists, sometimes not."""
        found = self.model.provider()
        if found is None or self.chance(0.08):
            return self.model.new_uuid()
        return found

    def rc(self) -> str:
        pick = self.rng.random()
        if pick < 0.05:
            return "CUSTOM_NOPE"
        if pick < 0.07:
            return "bad-class"
        return self.rng.choice(self.model.classes())

    def trait(self) -> str:
        pick = self.rng.random()
        if pick < 0.05:
            return "CUSTOM_UNKNOWN_T"
        if pick < 0.07:
            return "not_a_trait"
        return self.rng.choice(self.model.traits())

    def generation(self, rp: str):
        generation = self.model.providers.get(rp, {}).get("generation") or 0
        roll = self.rng.random()
        if roll < 0.07:
            return generation + self.rng.choice([-1, 1, 5])
        if roll < 0.09:
            return self.rng.choice(["1", None, 1.5])
        return generation

    def inventory(self) -> dict:
        total = self.rng.choice([1, 4, 8, 16, 1024])
        inv = {"total": total}
        if self.chance(0.5):
            inv["reserved"] = self.rng.choice([0, 1, total, total + 1])
        if self.chance(0.3):
            inv["min_unit"] = self.rng.choice([1, 2, 0])
        if self.chance(0.3):
            inv["max_unit"] = self.rng.choice([1, total, total * 2])
        if self.chance(0.3):
            inv["step_size"] = self.rng.choice([1, 2])
        if self.chance(0.3):
            inv["allocation_ratio"] = self.rng.choice([1.0, 16.0, 0.5, 0])
        if self.chance(0.04):
            inv["total"] = self.rng.choice([0, -1, "8", 2 ** 40])
        if self.chance(0.03):
            inv["bogus"] = 1
        return inv

    # -- providers -------------------------------------------------------------
    def create_provider(self):
        v = self.version()
        self.model.counter += 1
        body = {"name": f"rp-{self.model.counter}"}
        if self.chance(0.85):
            body["uuid"] = self.model.new_uuid()
        if v >= mv(14) and self.model.providers and self.chance(0.4):
            body["parent_provider_uuid"] = self.rp()
        roll = self.rng.random()
        if roll < 0.04 and self.model.providers:
            body["name"] = self.model.providers[self.model.provider()]["name"] or "dup"
        elif roll < 0.06:
            body["uuid"] = "not-a-uuid"
        elif roll < 0.08:
            body = {"uuid": self.model.new_uuid()}
        elif roll < 0.09:
            body["name"] = "x" * 201
        elif roll < 0.10 and self.model.providers:
            body["uuid"] = self.model.provider()
        return self.request("POST", "/resource_providers", v, body)

    def show_provider(self):
        return self.request("GET", f"/resource_providers/{self.rp()}", self.version())

    def update_provider(self):
        rp, v = self.rp(), self.version()
        self.model.counter += 1
        body = {"name": f"renamed-{self.model.counter}"}
        if v >= mv(14) and self.chance(0.4):
            current = self.model.providers.get(rp, {})
            options = [current.get("parent"), None, self.rp()]
            body["parent_provider_uuid"] = self.rng.choice(options)
        if self.chance(0.05):
            body["generation"] = 3
        return self.request("PUT", f"/resource_providers/{rp}", v, body)

    def delete_provider(self):
        return self.request("DELETE", f"/resource_providers/{self.rp()}", self.version())

    def list_providers(self):
        v = self.version()
        query = {}
        roll = self.rng.random()
        if roll < 0.15 and self.model.providers:
            query["name"] = self.model.providers[self.model.provider()]["name"] or ""
        elif roll < 0.3:
            query["uuid"] = self.rp()
        elif roll < 0.45 and v >= mv(3):
            query["member_of"] = "in:" + ",".join(self.rng.sample(self.model.aggregates, 2))
        elif roll < 0.6 and v >= mv(4):
            query["resources"] = f"{self.rc()}:{self.rng.choice([1, 2, 100])}"
        elif roll < 0.7 and v >= mv(18):
            query["required"] = self.trait() if self.chance(0.7) else "!" + self.trait()
        elif roll < 0.8 and v >= mv(14):
            query["in_tree"] = self.rp()
        elif roll < 0.85:
            query[self.rng.choice(["bogus", "resources", "member_of"])] = "???"
        return self.request("GET", "/resource_providers" + ("?" + urlencode(query) if query else ""), v)

    # -- inventories -------------------------------------------------------------
    def set_inventories(self):
        rp, v = self.rp(), self.version()
        classes = self.rng.sample(self.model.classes(), min(len(self.model.classes()), self.rng.randint(1, 3)))
        inventories = {rc: self.inventory() for rc in classes}
        if self.chance(0.04):
            inventories[self.rc()] = self.inventory()
        body = {"resource_provider_generation": self.generation(rp), "inventories": inventories}
        if self.chance(0.03):
            body = {"inventories": inventories}
        return self.request("PUT", f"/resource_providers/{rp}/inventories", v, body)

    def inventory_item(self):
        rp, v, rc = self.rp(), self.version(), self.rc()
        roll = self.rng.random()
        if roll < 0.3:
            return self.request("GET", f"/resource_providers/{rp}/inventories/{rc}", v)
        body = dict(self.inventory(), resource_provider_generation=self.generation(rp))
        if roll < 0.55:
            return self.request("PUT", f"/resource_providers/{rp}/inventories/{rc}", v, body)
        if roll < 0.8:
            body["resource_class"] = rc
            return self.request("POST", f"/resource_providers/{rp}/inventories", v, body)
        return self.request("DELETE", f"/resource_providers/{rp}/inventories/{rc}", v)

    def get_inventories(self):
        rp, v = self.rp(), self.version()
        if self.chance(0.3):
            return self.request("DELETE", f"/resource_providers/{rp}/inventories", v)
        return self.request("GET", f"/resource_providers/{rp}/inventories", v)

    # -- aggregates, traits, classes ---------------------------------------------
    def aggregates(self):
        rp, v = self.rp(), self.version(1)
        if self.chance(0.4):
            return self.request("GET", f"/resource_providers/{rp}/aggregates", v)
        aggs = self.rng.sample(self.model.aggregates, self.rng.randint(0, 3))
        if self.chance(0.04):
            aggs.append("not-a-uuid")
        if v >= mv(19) and self.chance(0.95):
            body = {"aggregates": aggs, "resource_provider_generation": self.generation(rp)}
        else:
            body = aggs
        return self.request("PUT", f"/resource_providers/{rp}/aggregates", v, body)

    def provider_traits(self):
        rp, v = self.rp(), self.version(6)
        roll = self.rng.random()
        if roll < 0.3:
            return self.request("GET", f"/resource_providers/{rp}/traits", v)
        if roll < 0.45:
            return self.request("DELETE", f"/resource_providers/{rp}/traits", v)
        traits = self.rng.sample(self.model.traits(), self.rng.randint(0, 3))
        if self.chance(0.05):
            traits.append(self.trait())
        body = {"traits": traits, "resource_provider_generation": self.generation(rp)}
        return self.request("PUT", f"/resource_providers/{rp}/traits", v, body)

    def resource_classes(self):
        v = self.version(2)
        names = ["CUSTOM_GPU", "CUSTOM_FPGA", "CUSTOM_MAGIC", "CUSTOM_GPU", "VCPU", "CUSTOM_lower"]
        name = self.rng.choice(names)
        roll = self.rng.random()
        if roll < 0.2:
            return self.request("GET", "/resource_classes", v)
        if roll < 0.45:
            return self.request("POST", "/resource_classes", v, {"name": name})
        if roll < 0.65:
            return self.request("PUT", f"/resource_classes/{name}", v)
        if roll < 0.8:
            return self.request("GET", f"/resource_classes/{name}", v)
        return self.request("DELETE", f"/resource_classes/{name}", v)

    def traits(self):
        v = self.version(6)
        name = self.rng.choice(["CUSTOM_T1", "CUSTOM_T2", "CUSTOM_T3", "HW_CPU_X86_AVX", "CUSTOM_bad", "FOO"])
        roll = self.rng.random()
        if roll < 0.25:
            query = self.rng.choice([{}, {"name": "startswith:CUSTOM"}, {"name": "in:CUSTOM_T1,HW_CPU_X86_AVX"},
                                     {"associated": "true"}, {"associated": "false"}, {"associated": "maybe"},
                                     {"name": "bogus"}])
            query = {k: q for k, q in query.items()}
            return self.request("GET", "/traits" + ("?" + urlencode(query) if query else ""), v)
        method = self.rng.choice(["PUT", "PUT", "GET", "DELETE"])
        return self.request(method, f"/traits/{name}", v)

    # -- allocations -------------------------------------------------------------
    def consumer(self, new: float = 0.3) -> str:
        if not self.model.consumers or self.chance(new):
            return self.model.new_uuid()
        # In the order seen, never by uuid: a consumer may be named by a provider
        # uuid the reference generated (GET /allocations/{uuid}), and that order
        # would change the stream from run to run.
        known = list(self.model.consumers)
        if self.model.refused_consumers and self.chance(0.1):
            known = list(self.model.refused_consumers)
        return self.rng.choice(known)

    def allocation_body(self, v, consumer: str) -> dict:
        rps = [self.rp() for _ in range(self.rng.randint(1, 2))]
        if v >= mv(12):
            allocations = {rp: {"resources": {self.rc(): self.rng.choice([1, 1, 2, 4, 0, 100])}} for rp in rps}
            body = {"allocations": allocations}
            if self.chance(0.05):
                body["allocations"] = {}
        else:
            body = {"allocations": [{"resource_provider": {"uuid": rp},
                                     "resources": {self.rc(): self.rng.choice([1, 2, 4, 0])}} for rp in rps]}
        if v >= mv(8) and self.chance(0.95):
            body["project_id"] = self.rng.choice(self.model.projects)
            body["user_id"] = self.rng.choice(self.model.users)
        if v >= mv(28):
            generation = self.model.consumers.get(consumer)
            if self.chance(0.1):
                generation = self.rng.choice([0, 7, None])
            body["consumer_generation"] = generation
        if v >= mv(38) and self.chance(0.5):
            body["consumer_type"] = self.rng.choice(["INSTANCE", "MIGRATION", "bad type"])
        return body

    def put_allocations(self):
        v, consumer = self.version(), self.consumer()
        return self.request("PUT", f"/allocations/{consumer}", v, self.allocation_body(v, consumer))

    def get_allocations(self):
        return self.request("GET", f"/allocations/{self.consumer(0.1)}", self.version())

    def delete_allocations(self):
        return self.request("DELETE", f"/allocations/{self.consumer(0.1)}", self.version())

    def post_allocations(self):
        v = self.version(13)
        body = {}
        for _ in range(self.rng.randint(1, 2)):
            consumer = self.consumer()
            inner = self.allocation_body(mv(max(v[1], 12)), consumer)
            inner.setdefault("project_id", "proj-a")
            inner.setdefault("user_id", "user-a")
            if v < mv(28):
                inner.pop("consumer_generation", None)
            if v < mv(38):
                inner.pop("consumer_type", None)
            body[consumer] = inner
        return self.request("POST", "/allocations", v, body)

    def usages(self):
        if self.chance(0.5):
            return self.request("GET", f"/resource_providers/{self.rp()}/usages", self.version())
        v = self.version(9)
        query = {"project_id": self.rng.choice(self.model.projects)}
        if self.chance(0.4):
            query["user_id"] = self.rng.choice(self.model.users)
        if v >= mv(38) and self.chance(0.3):
            query["consumer_type"] = self.rng.choice(["INSTANCE", "all", "unknown"])
        if self.chance(0.05):
            query = {}
        return self.request("GET", "/usages?" + urlencode(query), v)

    def allocation_candidates(self):
        v = self.version(10)
        query = {"resources": ",".join(f"{rc}:{self.rng.choice([1, 1, 2, 8])}"
                                       for rc in self.rng.sample(self.model.classes()[:3], self.rng.randint(1, 2)))}
        if self.chance(0.05):
            query["resources"] = self.rc() + ":1"
        if v >= mv(16) and self.chance(0.3):
            query["limit"] = str(self.rng.choice([1, 2, 0]))
        if v >= mv(17) and self.chance(0.3):
            query["required"] = self.trait() if v < mv(22) or self.chance(0.5) else "!" + self.trait()
        if v >= mv(21) and self.chance(0.2):
            query["member_of"] = self.rng.choice(self.model.aggregates)
        suffix = None
        if v >= mv(25) and self.chance(0.3):
            suffix = "1" if v < mv(33) else self.rng.choice(["1", "_NET"])
            classes = self.model.classes()[:3]
            if self.chance(0.2):
                classes = ["CUSTOM_NOPE"]
            query[f"resources{suffix}"] = f"{self.rng.choice(classes)}:1"
            if self.chance(0.8):
                query["group_policy"] = self.rng.choice(["none", "isolate", "bogus"])
            self._group_filters(query, suffix, v)
        if v >= mv(31) and self.chance(0.1):
            query["in_tree"] = self.rp()
        if v >= mv(35) and self.chance(0.1):
            query["root_required"] = self.trait()
        if v >= mv(36) and self.chance(0.2):
            # A resourceless group (1.36), named with a group of resources in
            # same_subtree; its filters may be only forbidden ones, or in_tree.
            if suffix is None:
                suffix = "1" if self.chance(0.5) else "_NET"
                query[f"resources{suffix}"] = f"{self.rng.choice(self.model.classes()[:3])}:1"
            empty = self.rng.choice(["2", "_R"])
            self._group_filters(query, empty, v, at_least_one=True)
            query["same_subtree"] = f"{suffix},{empty}" if self.chance(0.9) else f"{empty},{suffix}"
            query.setdefault("group_policy", self.rng.choice(["none", "isolate"]))
        return self.request("GET", "/allocation_candidates?" + urlencode(query), v)

    def _group_filters(self, query: dict, suffix: str, v, *, at_least_one: bool = False) -> None:
        """Some of a suffixed group's own filters: required or forbidden
        traits, member_of (or a forbidden aggregate from 1.32), in_tree."""
        while True:
            if self.chance(0.4):
                query[f"required{suffix}"] = self.trait() if self.chance(0.5) else "!" + self.trait()
            if self.chance(0.25):
                aggregate = self.rng.choice(self.model.aggregates)
                query[f"member_of{suffix}"] = "!" + aggregate if v >= mv(32) and self.chance(0.4) else aggregate
            if v >= mv(31) and self.chance(0.15):
                query[f"in_tree{suffix}"] = self.rp()
            if not at_least_one or any(key.endswith(suffix) and not key.startswith("resources") for key in query):
                return

    def reshaper(self):
        """A reshape with the service role (the new defaults want it): mostly
        one that moves a known consumer's allocations, or part of them, to
        another provider of the same tree together with the inventory; often
        spoilt (inventory taken away from under allocations, a stale
        generation, a class or provider that does not exist, too much asked);
        sometimes a random one, or one without the service role (403)."""
        v = self.version(30)
        moves = [c for c in self.model.holdings if self.model.consumers.get(c) is not None]
        if not moves and self.planned_move is None and self.chance(0.5):
            return self._reshape_scene()
        plan, self.planned_move = self.planned_move, None
        if plan is None and moves and self.chance(0.6):
            plan = self._plan_move(self.rng.choice(moves))
        if plan is not None:
            unknown = [rp for rp in plan[1:3] if self.model.providers.get(rp, {}).get("generation", 0) is None]
            if unknown and not plan[4]:
                # Read the generation first (the next request carries out the plan).
                self.planned_move = plan[:4] + (True,)
                return self.request("GET", f"/resource_providers/{unknown[0]}", self.version())
            body = self._moving_reshape(v, *plan[:4])
        if plan is None or body is None:
            body = self._random_reshape(v)
        headers = {"X-Roles": "admin,service"} if self.chance(0.9) else None
        return self.request("POST", "/reshaper", v, body, headers=headers)

    def _reshape_scene(self) -> dict:
        """A compute node with a consumer on it and an empty child, then a
        reshape that moves a class and its allocation to the child (kept
        valid or spoilt by ``_moving_reshape``): the random stream seldom
        builds that picture by itself."""
        root, child, consumer = self.model.new_uuid(), self.model.new_uuid(), self.model.new_uuid()
        self.model.counter += 1
        n = self.model.counter
        v = mv(self.rng.randint(max(self.low, 30), max(self.low, 30, self.high)))

        def inventory():
            return self.request("PUT", f"/resource_providers/{root}/inventories", v, {
                "resource_provider_generation": self.generation(root),
                "inventories": {"VCPU": {"total": 8}, "DISK_GB": {"total": 100}}})

        def allocate():
            return self.request("PUT", f"/allocations/{consumer}", v, self._consumer_entry(
                v, consumer, {root: {"VCPU": 1, "DISK_GB": 10}}, None))

        def reshape():
            held = self.model.holdings.get(consumer, {}).get(root, {})
            plan = (consumer, root, child, ["DISK_GB"] if "DISK_GB" in held else sorted(held)[:1], False)
            self.planned_move = plan if held else None
            return self.reshaper()

        self.script = [
            lambda: self.request("POST", "/resource_providers", v, {"name": f"scene-child-{n}", "uuid": child,
                                                                    "parent_provider_uuid": root}),
            inventory, allocate,
            lambda: self.request("GET", f"/allocations/{consumer}", v),
            lambda: self.request("GET", f"/resource_providers/{root}", v),
            reshape,
        ]
        return self.request("POST", "/resource_providers", v, {"name": f"scene-root-{n}", "uuid": root})

    def _tree_mates(self, rp: str) -> list[str]:
        root = self.model.providers.get(rp, {}).get("root", rp)
        return [uuid for uuid, ref in self.model.providers.items() if ref.get("root", uuid) == root]

    def _consumer_entry(self, v, consumer: str, allocations: dict, generation) -> dict:
        entry = {"allocations": {rp: {"resources": resources} for rp, resources in allocations.items()},
                 "project_id": self.rng.choice(self.model.projects), "user_id": self.rng.choice(self.model.users),
                 "consumer_generation": generation}
        if v >= mv(38):
            entry["consumer_type"] = self.rng.choice(["INSTANCE", "MIGRATION"])
        return entry

    def _plan_move(self, consumer: str) -> tuple:
        """(consumer, source, target, classes moving, generations read)."""
        held = self.model.holdings[consumer]
        source = self.rng.choice(sorted(held))
        mates = [rp for rp in self._tree_mates(source) if rp != source] or [source]
        target = self.rng.choice(mates)
        moving = self.rng.sample(sorted(held[source]), self.rng.randint(1, len(held[source])))
        return consumer, source, target, moving, False

    def _moving_reshape(self, v, consumer: str, source: str, target: str, moving: list[str]) -> dict | None:
        held = {rp: dict(resources) for rp, resources in self.model.holdings.get(consumer, {}).items()}
        moving = [rc for rc in moving if rc in held.get(source, {})]
        if not moving:
            return None  # the consumer's allocations changed since the plan
        # Inventories: the source keeps what it had except the classes that move
        # (as far as the model knows), the target gets them.
        source_classes = self.model.providers.get(source, {}).get("inventories") or sorted(held[source])
        kept = {rc: {"total": 1024} for rc in source_classes if rc not in moving}
        received = {rc: {"total": max(held[source][rc], 1) * self.rng.choice([1, 2, 4])} for rc in moving}
        target_classes = self.model.providers.get(target, {}).get("inventories") or []
        received.update({rc: {"total": 1024} for rc in target_classes if rc not in received})
        new_held = {rp: dict(resources) for rp, resources in held.items()}
        for rc in moving:
            amount = new_held[source].pop(rc)
            new_held.setdefault(target, {})[rc] = new_held.get(target, {}).get(rc, 0) + amount
        new_held = {rp: resources for rp, resources in new_held.items() if resources}
        inventories = {source: kept, target: received} if target != source else {source: {**kept, **received}}
        generation = self.model.consumers.get(consumer)
        spoil = self.rng.random()
        if spoil < 0.12:
            new_held = held  # the allocations stay behind: inventory in use
        elif spoil < 0.2:
            generation = (generation or 0) + self.rng.choice([1, -1, 3])
        elif spoil < 0.26 and moving:
            received[moving[0]]["total"] = 1  # (if the amount is larger) too little room
            new_held.setdefault(target, {})[moving[0]] = new_held.get(target, {}).get(moving[0], 0) + 1
        elif spoil < 0.3:
            inventories[target] = {}  # the target has nothing to give
        elif spoil < 0.34:
            new_held.setdefault(self.model.new_uuid(), {}).update({"VCPU": 1})
        elif spoil < 0.38:
            inventories[target]["CUSTOM_NOPE"] = {"total": 1}
        body = {"inventories": {rp: {"resource_provider_generation": self.generation(rp), "inventories": inv}
                                for rp, inv in inventories.items()},
                "allocations": {consumer: self._consumer_entry(v, consumer, new_held, generation)}}
        if self.chance(0.2):
            newcomer = self.consumer(1.0)
            body["allocations"][newcomer] = self._consumer_entry(
                v, newcomer, {target: {self.rng.choice(moving): 1}}, None)
        return body

    def _random_reshape(self, v) -> dict:
        rp = self.rp()
        inventories = {rp: {"resource_provider_generation": self.generation(rp),
                            "inventories": {self.rc(): self.inventory()} if self.chance(0.8) else {}}}
        mates = [m for m in self._tree_mates(rp) if m != rp]
        if mates and self.chance(0.4):
            mate = self.rng.choice(mates)
            inventories[mate] = {"resource_provider_generation": self.generation(mate),
                                 "inventories": {self.rc(): self.inventory()}}
        body = {"inventories": inventories, "allocations": {}}
        if self.chance(0.5):
            consumer = self.consumer()
            inner = self.allocation_body(mv(max(v[1], 28)), consumer)
            inner.pop("consumer_type", None) if v < mv(38) else None
            if v >= mv(38):
                inner.setdefault("consumer_type", "INSTANCE")
            inner.setdefault("project_id", "proj-a")
            inner.setdefault("user_id", "user-a")
            inner.setdefault("consumer_generation", None)
            body["allocations"][consumer] = inner
        return body

    # -- deliberately wrong requests --------------------------------------------
    def noise(self):
        rp = self.rp()
        paths = ["/", "/resource_providers", f"/resource_providers/{rp}", f"/resource_providers/{rp}/inventories",
                 f"/resource_providers/{rp}/traits", "/traits", "/resource_classes", f"/allocations/{rp}",
                 "/allocations", "/usages", "/allocation_candidates?resources=VCPU:1", "/reshaper",
                 "/nowhere", f"/resource_providers/{rp}/nothing", "/resource_providers/"]
        path = self.rng.choice(paths)
        roll = self.rng.random()
        v = self.version()
        if roll < 0.2:
            bad = self.rng.choice(["-1.2", "1.99", "2.0", "1.x", "1", "1.2.3", "latest", "1.05", "0.9",
                                   " 1.30 ", "1.40", "abc"])
            return self.request("GET", path, f"placement {bad}")
        if roll < 0.3:
            return self.request("GET", path, v, headers={"Accept": self.rng.choice(
                ["text/plain", "text/html", "application/xml", "application/json;q=0.5, text/html",
                 "*/*", "application/*"])})
        if roll < 0.45:
            return self.request(self.rng.choice(METHODS), path, v)
        if roll < 0.55:
            return self.request("GET", path, v, token=None)
        if roll < 0.75:
            targets = ["/resource_providers", f"/resource_providers/{rp}/inventories",
                       "/resource_classes", "/allocations", f"/resource_providers/{rp}/traits"]
            target = self.rng.choice(targets)
            method = "PUT" if "/traits" in target or "/inventories" in target else "POST"
            raw = self.rng.choice([b"{", b'{"name": "x",}', b'{"name": NaN}', b'{"name": Infinity}',
                                   b"[]", b"null", b'"text"', b"", b'{"name": "a", "name": "b"}',
                                   b'{"total": -Infinity}', b"\xff\xfe"])
            return self.request(method, target, v, raw=raw)
        if roll < 0.85:
            request = self.request("POST", "/resource_providers", v, {"name": "ct"})
            request["headers"]["Content-Type"] = self.rng.choice(["text/plain", "application/xml", ""])
            return request
        return self.request("GET", path.split("?")[0] + "?" + self.rng.choice(
            ["%ff=1", "a=%00", "resources=VCPU:1&resources=VCPU:2", "limit=x"]), v)

    def next(self) -> dict:
        if self.script:
            return self.script.pop(0)()
        if self.planned_move is not None:
            return self.reshaper()
        pick = self.rng.uniform(0, self.total)
        for weight, action in self.actions:
            pick -= weight
            if pick <= 0:
                return action()
        return self.actions[-1][1]()


def quote_path(path: str) -> str:
    return quote(path, safe="/?=&:,!%")
