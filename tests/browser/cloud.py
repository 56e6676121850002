"""A small cloud, written through the HTTP API of a live server.

Nested compute trees (NUMA children, a GPU grandchild), a sharing storage
provider, traits, two aggregates, consumers of several projects and users,
and enough plain hosts to need a second page of trees.  What the tests
assert is read back from the API, never taken from here.
"""

from __future__ import annotations

import uuid as uuidlib

import requests

HEADERS = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39", "Accept": "application/json"}


class Client:
    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers.update(HEADERS)

    def call(self, method: str, path: str, json=None, expect=(200, 201, 204)):
        response = self.session.request(method, self.url + path, json=json, timeout=60)
        assert response.status_code in expect, f"{method} {path}: {response.status_code} {response.text[:300]}"
        return response.json() if response.content else None

    def get(self, path: str):
        return self.call("GET", path, expect=(200,))


def _inv(total, ratio=1.0, reserved=0, max_unit=None, min_unit=1, step=1):
    return {"total": total, "reserved": reserved, "allocation_ratio": ratio, "min_unit": min_unit,
            "max_unit": max_unit or total, "step_size": step}


class InProcess:
    """The same calls, through the test suite's in-process ``ApiClient``."""

    def __init__(self, client):
        self.client = client

    def call(self, method: str, path: str, json=None, expect=(200, 201, 204)):
        response = self.client.request(method, path, json=json, version="1.39")
        assert response.status in expect, f"{method} {path}: {response.status} {response.text[:300]}"
        return response.json if response.text else None

    def get(self, path: str):
        return self.call("GET", path, expect=(200,))


def seed(target) -> dict:
    """Write the cloud through ``target`` (a server's URL, or a ``Client`` /
    ``InProcess``); return {provider name: uuid, "aggregates": {...},
    "consumers": [...]}."""
    api = Client(target) if isinstance(target, str) else target
    names: dict = {}
    aggregates = {"rack-a": str(uuidlib.uuid4()), "rack-b": str(uuidlib.uuid4())}
    names["aggregates"] = aggregates
    for trait in ("CUSTOM_GOLD", "CUSTOM_MAINTENANCE"):
        api.call("PUT", f"/traits/{trait}")
    api.call("PUT", "/resource_classes/CUSTOM_FPGA")

    def provider(name, parent=None, inventories=None, traits=(), aggs=()):
        body = {"name": name}
        if parent:
            body["parent_provider_uuid"] = names[parent]
        created = api.call("POST", "/resource_providers", json=body)
        uuid = created["uuid"]
        names[name] = uuid
        generation = created["generation"]
        if inventories:
            generation = api.call("PUT", f"/resource_providers/{uuid}/inventories",
                                  json={"resource_provider_generation": generation,
                                        "inventories": inventories})["resource_provider_generation"]
        if traits:
            generation = api.call("PUT", f"/resource_providers/{uuid}/traits",
                                  json={"resource_provider_generation": generation,
                                        "traits": list(traits)})["resource_provider_generation"]
        if aggs:
            api.call("PUT", f"/resource_providers/{uuid}/aggregates",
                     json={"resource_provider_generation": generation, "aggregates": list(aggs)})
        return uuid

    for i in range(1, 7):
        rack = aggregates["rack-a" if i <= 3 else "rack-b"]
        traits = ["COMPUTE_VOLUME_MULTI_ATTACH"]
        traits += ["HW_CPU_X86_AVX2"] if i <= 4 else []
        traits += ["CUSTOM_GOLD"] if i <= 2 else []
        traits += ["CUSTOM_MAINTENANCE"] if i == 6 else []
        root = f"cn-{i:02d}"
        provider(root, inventories={"DISK_GB": _inv(2000, reserved=100)} if i <= 4 else None,
                 traits=traits, aggs=[rack])
        for cell in (0, 1):
            provider(f"{root}-numa{cell}", root,
                     {"VCPU": _inv(16, ratio=4.0, max_unit=16),
                      "MEMORY_MB": _inv(65536, reserved=2048, ratio=1.0)},
                     traits=["HW_NUMA_ROOT"])
        if i in (2, 5):
            provider(f"{root}-gpu0", f"{root}-numa0", {"VGPU": _inv(4)}, traits=["CUSTOM_GOLD"])
        if i == 3:
            provider(f"{root}-fpga0", f"{root}-numa1", {"CUSTOM_FPGA": _inv(2)})
    provider("shared-storage-b", inventories={"DISK_GB": _inv(20000, reserved=500, min_unit=10, step=10)},
             traits=["MISC_SHARES_VIA_AGGREGATE", "STORAGE_DISK_SSD"], aggs=[aggregates["rack-b"]])
    for i in range(1, 21):
        provider(f"edge-{i:02d}", inventories={"VCPU": _inv(8, ratio=2.0), "MEMORY_MB": _inv(16384, reserved=512)},
                 traits=["HW_CPU_X86_SSE42"])

    def allocate(project, user, allocations, consumer_type="INSTANCE"):
        consumer = str(uuidlib.uuid4())
        api.call("PUT", f"/allocations/{consumer}", json={
            "allocations": {names[rp]: {"resources": res} for rp, res in allocations.items()},
            "project_id": project, "user_id": user, "consumer_generation": None,
            "consumer_type": consumer_type})
        return consumer

    names["consumers"] = [
        allocate("proj-alpha", "alice", {"cn-01-numa0": {"VCPU": 8, "MEMORY_MB": 16384}, "cn-01": {"DISK_GB": 200}}),
        allocate("proj-alpha", "alice", {"cn-01-numa1": {"VCPU": 4, "MEMORY_MB": 8192}, "cn-01": {"DISK_GB": 40}}),
        allocate("proj-alpha", "anna", {"cn-02-numa0": {"VCPU": 16, "MEMORY_MB": 32768},
                                        "cn-02-gpu0": {"VGPU": 2}, "cn-02": {"DISK_GB": 100}}),
        # cn-03 nearly full on memory: the fullest tree.
        allocate("proj-beta", "bob", {"cn-03-numa0": {"VCPU": 16, "MEMORY_MB": 61440}, "cn-03": {"DISK_GB": 500}}),
        allocate("proj-beta", "bob", {"cn-03-numa1": {"VCPU": 16, "MEMORY_MB": 61440},
                                      "cn-03-fpga0": {"CUSTOM_FPGA": 1}}),
        allocate("proj-beta", "bea", {"cn-05-numa0": {"VCPU": 4, "MEMORY_MB": 8192},
                                      "shared-storage-b": {"DISK_GB": 400}}),
        allocate("proj-gamma", "gus", {"edge-01": {"VCPU": 4, "MEMORY_MB": 4096}}, consumer_type="MIGRATION"),
        allocate("proj-gamma", "gus", {"edge-02": {"VCPU": 2, "MEMORY_MB": 2048}}),
    ]
    return names
