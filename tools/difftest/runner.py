"""Send one stream to two servers, compare the answers, shrink divergences."""

from __future__ import annotations

import collections
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

from generator import Generator, Profile

REPO = Path(__file__).resolve().parents[2]


def _reference_serve() -> Path:
    """The reference's launcher: explicit override, beside the checkout, or
    /work/shared (where tools/conformance also looks: a clone elsewhere)."""
    if os.environ.get("ALLOTMENT_REFERENCE_SERVE"):
        return Path(os.environ["ALLOTMENT_REFERENCE_SERVE"])
    for candidate in (REPO.parent / "shared" / "reference" / "serve", Path("/work/shared/reference/serve")):
        if candidate.exists():
            return candidate
    return REPO.parent / "shared" / "reference" / "serve"


REFERENCE = _reference_serve()
# DIFFTEST_PORTS=LOW-HIGH: the ports servers may use (parallel runs on a shared machine).
_LOW, _HIGH = (int(x) for x in os.environ.get("DIFFTEST_PORTS", "22000-22999").split("-"))
PORTS = range(_LOW, _HIGH + 1)
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Headers compared by value (names compared case-insensitively); Last-Modified by presence only.
COMPARED_HEADERS = ("content-type", "location", "allow", "openstack-api-version", "vary",
                    "cache-control", "www-authenticate")


class StartError(RuntimeError):
    """A server could not be started."""


def _free_port(taken: set[int]) -> int:
    # Random order: parallel runs on one machine rarely pick the same port.
    ports = list(PORTS)
    random.SystemRandom().shuffle(ports)
    for port in ports:
        if port in taken:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise StartError(f"no free port in {_LOW}-{_HIGH}")


_TAKEN: set[int] = set()


class Server:
    """A server in its own process group on a fresh SQLite file."""

    def __init__(self, kind: str, workdir: Path):
        self.kind = kind
        workdir.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=workdir))
        self.port = _free_port(_TAKEN)
        self.url = f"http://127.0.0.1:{self.port}"
        config = self.dir / "placement.conf"
        config.write_text(textwrap.dedent(f"""\
            [placement_database]
            connection = sqlite:///{self.dir}/placement.sqlite
            [api]
            auth_strategy = noauth2
            """))
        if kind == "ours":
            allotment = Path(sys.executable).parent / "allotment"
            command = [str(allotment) if allotment.exists() else "allotment", "serve", "--config-file",
                       str(config), "--port", str(self.port), "--workers", "1"]
        else:
            if not REFERENCE.exists():
                raise StartError(f"no reference server at {REFERENCE}")
            command = [str(REFERENCE), "--config-file", str(config), "--port", str(self.port), "--workers", "1"]
        self.log = open(self.dir / "server.log", "wb")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + (600 if kind == "reference" else 60)  # first use builds a venv
        while True:
            if self.process.poll() is not None:
                self.stop()
                raise StartError(f"{kind} server exited: {(self.dir / 'server.log').read_text(errors='replace')[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                time.sleep(0.3)
                if self.process.poll() is None:  # ours answering, not someone else's
                    break
                continue
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise StartError(f"{kind} server did not start")
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
        _TAKEN.discard(self.port)


class Client:
    def __init__(self, url: str):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.conn: http.client.HTTPConnection | None = None

    def send(self, request: dict, translate=None) -> dict:
        path, body = request["path"], request["body"]
        if translate:
            path = translate(path)
            if body is not None:
                body = translate(body.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
        for attempt in range(3):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
                self.conn.putrequest(request["method"], path, skip_accept_encoding=True)
                headers = dict(request["headers"])
                if body is not None:
                    headers["Content-Length"] = str(len(body))
                for name, value in headers.items():
                    self.conn.putheader(name, value)
                self.conn.endheaders(body)
                response = self.conn.getresponse()
                data = response.read()
                answer = {"status": response.status, "headers": {k.lower(): v for k, v in response.getheaders()},
                          "body": data}
                if response.will_close:
                    self.close()
                return answer
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable")

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def decode(answer: dict):
    try:
        return json.loads(answer["body"]) if answer["body"] else None
    except ValueError:
        return None


# -- normalisation ---------------------------------------------------------------
def _sorted(value):
    if isinstance(value, dict):
        return {k: _sorted(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [_sorted(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    return value


_QUOTED_LIST = re.compile(r"'([A-Za-z0-9_-]+(?:, [A-Za-z0-9_-]+)+)'")


def _detail(text: str) -> str:
    # jsonschema's messages embed the schema; Placement leaves that dump undefined
    # (it is the schema's repr), so compare up to it.
    text = text.split("Failed validating")[0]
    # Lists of providers or classes in a message come from a set: their order is undefined.
    text = _QUOTED_LIST.sub(lambda m: "'" + ", ".join(sorted(m.group(1).split(", "))) + "'", text)
    text = re.sub(r"req-[0-9a-f-]{36}", "req-ID", text)
    return " ".join(text.split())


def normalise(request: dict, answer: dict) -> dict:
    body = decode(answer)
    if isinstance(body, dict) and "errors" in body and isinstance(body["errors"], list):
        for error in body["errors"]:
            if isinstance(error, dict):
                error.pop("request_id", None)
                if isinstance(error.get("detail"), str):
                    error["detail"] = _detail(error["detail"])
                    if request["path"] == "/resource_providers" and "uuid" not in (request.get("json") or {}):
                        # The uuid the server would have given the provider.
                        error["detail"] = UUID_RE.sub("{generated uuid}", error["detail"])
    if isinstance(body, dict) and "limit=" in request["path"] and "allocation_requests" in body:
        body = {"allocation_requests (count)": len(body["allocation_requests"])}
    if body is None and answer["body"]:
        body = _detail(answer["body"].decode("utf-8", "replace"))
    headers = {}
    for name in COMPARED_HEADERS:
        if name in answer["headers"]:
            value = answer["headers"][name]
            if name == "location":
                value = urlsplit(value).path
            if name == "vary":
                value = value.lower()
            headers[name] = value
    headers["last-modified (present)"] = "last-modified" in answer["headers"]
    return {"status": answer["status"], "headers": headers, "body": _sorted(body)}


def route_template(path: str) -> str:
    path = path.split("?")[0]
    path = UUID_RE.sub("{uuid}", path)
    parts = path.split("/")
    if len(parts) >= 5 and parts[1] == "resource_providers" and parts[3] == "inventories":
        parts[4] = "{resource_class}"
    if len(parts) == 3 and parts[1] in ("resource_classes", "traits"):
        parts[2] = "{name}"
    return "/".join(parts)


class Pair:
    """The two servers (started fresh, or given by URL) and the uuid mapping between them."""

    def __init__(self, workdir: Path, ours_url: str | None = None, ref_url: str | None = None):
        self.servers: list[Server] = []
        try:
            if ref_url is None:
                server = Server("reference", workdir)
                self.servers.append(server)
                ref_url = server.url
            if ours_url is None:
                server = Server("ours", workdir)
                self.servers.append(server)
                ours_url = server.url
        except BaseException:
            self.stop()
            raise
        self.ref, self.ours = Client(ref_url), Client(ours_url)
        # The stream names a provider a server created without a given uuid by the
        # uuid the reference gave it when the stream was generated; each server
        # (the reference too, when a stream is replayed) has its own.
        self.outbound: dict[str, dict[str, str]] = {"ref": {}, "ours": {}}  # stream's -> server's
        self.inbound: dict[str, dict[str, str]] = {"ref": {}, "ours": {}}  # server's -> stream's

    def translate(self, mapping):
        def apply(text: str) -> str:
            if not mapping:
                return text
            return UUID_RE.sub(lambda m: mapping.get(m.group(0), m.group(0)), text)
        return apply

    def send(self, side: str, request: dict) -> dict:
        """One request to one server, in the stream's uuids both ways."""
        answer = getattr(self, side).send(request, self.translate(self.outbound[side]))
        if self.inbound[side]:
            self._rename(answer, self.inbound[side])
        return answer

    def exchange(self, request: dict) -> tuple[dict, dict]:
        """One request to both servers; both answers in the stream's uuids."""
        ref, ours = self.send("ref", request), self.send("ours", request)
        if request["method"] == "POST" and request["path"] == "/resource_providers":
            made = {side: answer["headers"].get("location", "").rsplit("/", 1)[-1]
                    for side, answer in (("ref", ref), ("ours", ours))}
            if all(made.values()):
                # First time through, the stream takes the reference's uuid (the
                # generator learns it from that answer); a replay keeps it.
                stream_uuid = request.setdefault("created", made["ref"])
                for (side, uuid), answer in zip(made.items(), (ref, ours)):
                    if uuid != stream_uuid:
                        self.outbound[side][stream_uuid], self.inbound[side][uuid] = uuid, stream_uuid
                        self._rename(answer, {uuid: stream_uuid})
        return ref, ours

    def _rename(self, answer: dict, mapping: dict[str, str]) -> None:
        back = self.translate(mapping)
        answer["body"] = back(answer["body"].decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
        if "location" in answer["headers"]:
            answer["headers"]["location"] = back(answer["headers"]["location"])

    def check_limited(self, request: dict, ours: dict) -> str | None:
        """Candidates returned under ``limit`` must be among the unlimited answer's."""
        split = urlsplit(request["path"])
        query = [(k, v) for k, v in parse_qsl(split.query) if k != "limit"]
        full = dict(request, path=split.path + "?" + urlencode(query))
        answer = self.send("ref", full)
        body_full, body_ours = decode(answer), decode(ours)
        if not (isinstance(body_full, dict) and isinstance(body_ours, dict)):
            return None
        known = {json.dumps(_sorted(c), sort_keys=True) for c in body_full.get("allocation_requests", [])}
        for candidate in body_ours.get("allocation_requests", []):
            if json.dumps(_sorted(candidate), sort_keys=True) not in known:
                return f"candidate not in the unlimited answer: {candidate}"
        return None

    def stop(self) -> None:
        for client in ("ref", "ours"):
            if hasattr(self, client):
                getattr(self, client).close()
        for server in self.servers:
            server.stop()


_UNKNOWN_TRAITS = re.compile(r"No such trait\(s\): ([A-Za-z0-9_]+(?:, [A-Za-z0-9_]+)*)\.")


def _one_unknown_trait(ref: dict, ours: dict) -> None:
    """Placement names one of several unknown traits, picked in set order (it
    changes from one process to the next); Allotment names them all.  Ours
    matches when it names the reference's among them."""
    if not (isinstance(ref["body"], dict) and isinstance(ours["body"], dict)):
        return
    for theirs, mine in zip(ref["body"].get("errors", []), ours["body"].get("errors", [])):
        a, b = (_UNKNOWN_TRAITS.search(str(e.get("detail", ""))) for e in (theirs, mine))
        if a and b and a.group(1) in b.group(1).split(", "):
            mine["detail"] = mine["detail"].replace(b.group(0), a.group(0))


def reference_crashed(ref: dict, ours: dict) -> bool:
    """Placement failed (5xx) where Allotment did not.

    A crash has no answer to match, and Allotment never answers 500 to bad
    input (docs/differences.md): counted apart, not as a divergence.
    """
    return ref["status"] >= 500 and ours["status"] < 500


def _groups(path: str) -> dict[str, dict[str, int]]:
    """The request groups of a GET /allocation_candidates: suffix -> {class: amount}
    ("" is the unsuffixed group)."""
    groups: dict[str, dict[str, int]] = {}
    for key, value in parse_qsl(urlsplit(path).query):
        match = re.fullmatch(r"resources([A-Za-z0-9_-]*)", key)
        if match:
            group = groups.setdefault(match.group(1), {})
            for part in value.split(","):
                name, _, amount = part.partition(":")
                if name and amount.isdigit():
                    group[name] = group.get(name, 0) + int(amount)
    return groups


def _requested_totals(path: str) -> dict[str, int]:
    """Units of each class a GET /allocation_candidates asks for, over all groups."""
    totals: dict[str, int] = {}
    for group in _groups(path).values():
        for name, amount in group.items():
            totals[name] = totals.get(name, 0) + amount
    return totals


def reference_inconsistent(request: dict, ref: dict) -> bool:
    """Placement's candidates do not add up to what was asked for.

    Its merging of request groups can add a group's amount to a provider
    more than once (seen with ``group_policy=isolate`` and the unsuffixed
    group sharing a class with a suffixed one: ``VCPU: 3`` where two were
    asked for).  Such an answer is wrong, not a behaviour to match: counted
    apart, not as a divergence.
    """
    if ref["status"] != 200 or not urlsplit(request["path"]).path == "/allocation_candidates":
        return False
    body = decode(ref)
    wanted = _requested_totals(request["path"])
    for candidate in (body or {}).get("allocation_requests", []):
        allocations = candidate.get("allocations")
        if not isinstance(allocations, dict):  # before 1.12: a list
            allocations = {i: a for i, a in enumerate(allocations or [])}
        got: dict[str, int] = {}
        for allocation in allocations.values():
            for name, amount in allocation.get("resources", {}).items():
                got[name] = got.get(name, 0) + amount
        if got != wanted:
            return True
    return False


SHARING_TRAIT = "MISC_SHARES_VIA_AGGREGATE"


def _candidate_key(candidate) -> str:
    return json.dumps(_sorted(candidate), sort_keys=True)


def _unsuffixed_on_sharing_only(candidate: dict, groups: dict[str, dict[str, int]], sharing: set[str]) -> bool:
    """Whether the unsuffixed group of one candidate is served by sharing
    providers alone.

    From 1.34 the candidate says so itself (its ``mappings``).  Before, only
    the summed allocations are there: the suffixed groups (each on one
    provider) are placed on the providers every way they fit, and the answer
    is yes when one placement leaves exactly the unsuffixed group's amounts,
    all of them on sharing providers.  Before 1.12 (a list) it is never yes.
    """
    mappings = candidate.get("mappings")
    if isinstance(mappings, dict) and "" in mappings:
        return bool(mappings[""]) and set(mappings[""]) <= sharing
    allocations = candidate.get("allocations")
    if not isinstance(allocations, dict):
        return False
    left = {uuid: dict(a.get("resources", {})) for uuid, a in allocations.items()}
    suffixed = [group for suffix, group in sorted(groups.items()) if suffix]

    def place(index: int) -> bool:
        if index == len(suffixed):
            rest = {uuid: {name: n for name, n in held.items() if n} for uuid, held in left.items()}
            rest = {uuid: held for uuid, held in rest.items() if held}
            summed: dict[str, int] = {}
            for held in rest.values():
                for name, n in held.items():
                    summed[name] = summed.get(name, 0) + n
            return bool(rest) and summed == groups.get("", {}) and set(rest) <= sharing
        group = suffixed[index]
        for held in left.values():
            if all(held.get(name, 0) >= n for name, n in group.items()):
                for name, n in group.items():
                    held[name] -= n
                found = place(index + 1)
                for name, n in group.items():
                    held[name] += n
                if found:
                    return True
        return False

    return place(0)


def _unlimited_bodies(request: dict, ref: dict, ours: dict, pair: Pair | None) -> tuple[dict, dict] | None:
    """Both servers' candidates for ``request`` without its ``limit`` (asked
    again when it has one), or None when the two cannot be compared that way:
    a status other than 200, headers that differ, or no pair to ask again."""
    if request["method"] != "GET" or urlsplit(request["path"]).path != "/allocation_candidates":
        return None
    if ref["status"] != 200 or ours["status"] != 200:
        return None
    a, b = normalise(request, ref), normalise(request, ours)
    if a["headers"] != b["headers"]:
        return None
    if "limit=" in request["path"]:
        if pair is None:
            return None
        split = urlsplit(request["path"])
        query = [(k, v) for k, v in parse_qsl(split.query) if k != "limit"]
        full = dict(request, path=split.path + "?" + urlencode(query))
        ref, ours = pair.send("ref", full), pair.send("ours", full)
        if ref["status"] != 200 or ours["status"] != 200:
            return None
    theirs, mine = decode(ref), decode(ours)
    if not (isinstance(theirs, dict) and isinstance(mine, dict)):
        return None
    return theirs, mine


def _only_in_more(fewer: dict, more: dict) -> list[dict] | None:
    """The candidates of ``more`` that ``fewer`` lacks, when ``fewer``'s are a
    strict subset of them and each provider ``fewer`` summarises is summarised
    alike in ``more``; None otherwise."""
    few = {_candidate_key(c) for c in fewer.get("allocation_requests", [])}
    many = {_candidate_key(c): c for c in more.get("allocation_requests", [])}
    if not few < set(many):
        return None
    summaries = more.get("provider_summaries") or {}
    for uuid, summary in (fewer.get("provider_summaries") or {}).items():
        if _sorted(summaries.get(uuid)) != _sorted(summary):
            return None
    return [candidate for key, candidate in many.items() if key not in few]


def reference_dropped_sharing_anchors(request: dict, ref: dict, ours: dict, pair: Pair | None = None) -> bool:
    """Placement left out candidates whose unsuffixed group is served by
    sharing providers alone, and nothing else differs.

    Within the unsuffixed group Placement builds one candidate per tree the
    sharing provider reaches, then puts them in a Python set whose equality
    ignores the tree: all but one collapse, and which one survives follows
    set iteration order, which depends on the string-hash seed of the
    process (the same database answers differently from one start to the
    next; docs/differences.md).  Allotment keeps every tree.
    Narrowly: the reference's candidates (unlimited) must be a strict subset
    of ours, and every candidate only we offer must have its unsuffixed group
    on providers that all carry MISC_SHARES_VIA_AGGREGATE.
    """
    groups = _groups(request["path"])
    if not groups.get(""):
        return False
    bodies = _unlimited_bodies(request, ref, ours, pair)
    if bodies is None:
        return False
    theirs, mine = bodies
    only_ours = _only_in_more(theirs, mine)
    if only_ours is None:
        return False
    summaries = mine.get("provider_summaries") or {}
    sharing = {uuid for uuid, summary in summaries.items()
               if isinstance((summary or {}).get("traits"), list) and SHARING_TRAIT in summary["traits"]}
    return all(_unsuffixed_on_sharing_only(candidate, groups, sharing) for candidate in only_ours)


def _resourceless_in_trees(path: str) -> dict[str, str]:
    """The suffixed groups of a GET /allocation_candidates that ask for no
    resources but name a tree: suffix -> the ``in_tree<suffix>`` provider."""
    with_resources = _groups(path)
    return {key[len("in_tree"):]: value for key, value in parse_qsl(urlsplit(path).query)
            if key.startswith("in_tree") and key != "in_tree" and key[len("in_tree"):] not in with_resources}


def reference_ignored_resourceless_in_tree(request: dict, ref: dict, ours: dict, pair: Pair | None = None) -> bool:
    """Placement let a resourceless group's provider come from outside the
    tree its ``in_tree<N>`` names, and nothing else differs.

    Placement 16.0.0 applies ``in_tree<N>`` only where it looks for
    providers with resources; a resourceless group (1.35) is looked up by
    its traits and aggregates alone, anywhere in the cloud.  Allotment keeps
    it to the tree asked for (docs/differences.md).
    Narrowly: our candidates (unlimited) must be a strict subset of the
    reference's, with the same summaries for the providers we name, and every
    candidate only the reference offers must map such a group to a provider
    whose root is not the root of that group's ``in_tree`` provider (roots
    asked of the reference, so only with a pair of live servers).
    """
    trees = _resourceless_in_trees(request["path"])
    if not trees or pair is None:
        return False
    bodies = _unlimited_bodies(request, ref, ours, pair)
    if bodies is None:
        return False
    theirs, mine = bodies
    only_theirs = _only_in_more(mine, theirs)
    if only_theirs is None:
        return False
    roots = {uuid: (summary or {}).get("root_provider_uuid")
             for uuid, summary in (theirs.get("provider_summaries") or {}).items()}
    headers = {name: value for name, value in request["headers"].items() if name.lower() != "openstack-api-version"}
    headers["OpenStack-API-Version"] = "placement 1.14"
    tree_roots = {}
    for suffix, uuid in trees.items():
        answer = pair.send("ref", {"method": "GET", "path": f"/resource_providers/{uuid}",
                                   "headers": headers, "body": None})
        root = (decode(answer) or {}).get("root_provider_uuid") if answer["status"] == 200 else None
        if not root:
            return False
        tree_roots[suffix] = root

    def outside(candidate: dict) -> bool:
        mappings = candidate.get("mappings")
        if not isinstance(mappings, dict):
            return False
        return any(roots.get(uuid) not in (None, tree_roots[suffix])
                   for suffix in trees for uuid in mappings.get(suffix, ()))

    return all(outside(candidate) for candidate in only_theirs)


def diverges(request: dict, ref: dict, ours: dict, pair: Pair | None = None) -> str | None:
    if reference_crashed(ref, ours) or reference_inconsistent(request, ref):
        return None
    a, b = normalise(request, ref), normalise(request, ours)
    if "IntegrityError" in json.dumps(a["body"]):
        # Placement leaks the database's own error (SQL, parameters, a
        # timestamp) in this text: undefined, so only its start is compared.
        for side in (a, b):
            for error in side["body"].get("errors", []):
                error["detail"] = error["detail"].split(":")[0]
    _one_unknown_trait(a, b)
    if a != b:
        return "answers differ"
    if pair is not None and "limit=" in request["path"] and ref["status"] == 200:
        return pair.check_limited(request, ours)
    return None


# -- running, shrinking and printing -------------------------------------------------------
class Run:
    def __init__(self, workdir: Path, *, ours_url=None, ref_url=None):
        self.workdir = workdir
        self.ours_url, self.ref_url = ours_url, ref_url

    def generate_and_run(self, seed: int, count: int, versions, profile: Profile):
        """Generate a stream against the live pair; returns (stream, divergent indexes, answers)."""
        generator = Generator(seed, versions, profile)
        pair = Pair(self.workdir, self.ours_url, self.ref_url)
        stream, divergent, answers = [], [], []
        self.crashes = []  # indexes where the reference failed or gave a wrong answer (not compared)
        self.dropped_anchors = []  # indexes where it dropped sharing-only trees (not compared)
        self.outside_in_tree = []  # indexes where it put a resourceless group outside its in_tree (not compared)
        try:
            for index in range(count):
                request = generator.next()
                ref, ours = pair.exchange(request)
                request["ref_status"] = ref["status"]  # for the shrinker: what changed state
                stream.append(request)
                answers.append((ref, ours))
                generator.model.observe(request, ref["status"], ref["headers"], decode(ref))
                if reference_crashed(ref, ours) or reference_inconsistent(request, ref):
                    self.crashes.append(index)
                elif diverges(request, ref, ours, pair):
                    if reference_dropped_sharing_anchors(request, ref, ours, pair):
                        self.dropped_anchors.append(index)
                    elif reference_ignored_resourceless_in_tree(request, ref, ours, pair):
                        self.outside_in_tree.append(index)
                    else:
                        divergent.append(index)
        finally:
            pair.stop()
        return stream, divergent, answers

    def replay(self, stream: list[dict]) -> tuple[dict, dict, str | None]:
        pair = Pair(self.workdir)
        try:
            for request in stream[:-1]:
                pair.exchange(request)
            ref, ours = pair.exchange(stream[-1])
            return ref, ours, diverges(stream[-1], ref, ours, pair)
        finally:
            pair.stop()

    def shrink(self, stream: list[dict], budget: int = 60) -> list[dict]:
        """ddmin over the requests before the divergent (last) one."""
        target, prefix = stream[-1], stream[:-1]
        replays = 0

        def fails(candidate):
            nonlocal replays
            replays += 1
            return self.replay(candidate + [target])[2] is not None

        if fails([]):
            return [target]
        # Only the writes the reference accepted changed its state: one replay
        # of those alone usually still diverges, at a fraction of the length.
        writes = [r for r in prefix if r["method"] not in ("GET", "HEAD") and 200 <= r.get("ref_status", 200) < 300]
        if len(writes) < len(prefix) and fails(writes):
            prefix = writes
        related = _related(prefix, target)
        if len(related) < len(prefix) and fails(related):
            prefix = related
        n = 2
        while len(prefix) >= 2 and replays < budget:
            size = len(prefix) // n
            chunks = [prefix[i:i + size] for i in range(0, len(prefix), size)] if size else [prefix]
            reduced = False
            for i in range(len(chunks)):
                complement = [r for j, c in enumerate(chunks) if j != i for r in c]
                if replays >= budget:
                    break
                if fails(complement):
                    prefix, n, reduced = complement, max(n - 1, 2), True
                    break
            if not reduced:
                if n >= len(prefix):
                    break
                n = min(len(prefix), n * 2)
        if len(prefix) == 1 and replays < budget and fails([]):
            prefix = []
        return prefix + [target]


def _tokens(request: dict) -> set[str]:
    text = request["path"] + (request["body"] or b"").decode("utf-8", "replace")
    return set(UUID_RE.findall(text)) | set(re.findall(r"CUSTOM_[A-Z0-9_]+", text))


def _related(prefix: list[dict], target: dict) -> list[dict]:
    """The requests linked to ``target`` through the uuids and custom names
    they share, transitively: usually a far shorter stream to start from."""
    wanted = _tokens(target)
    keep = [False] * len(prefix)
    changed = True
    while changed:
        changed = False
        for index in range(len(prefix) - 1, -1, -1):
            if not keep[index] and _tokens(prefix[index]) & wanted:
                keep[index] = True
                wanted |= _tokens(prefix[index])
                changed = True
    return [request for request, kept in zip(prefix, keep) if kept]


def curl(request: dict) -> str:
    parts = [f"curl -X {request['method']}"]
    for name, value in request["headers"].items():
        parts.append(f"-H '{name}: {value}'")
    if request["body"] is not None:
        parts.append("--data-binary " + repr(request["body"].decode("utf-8", "backslashreplace")))
    parts.append(f"$URL{request['path']}")
    return " ".join(parts)


def show(answer: dict) -> str:
    headers = {k: v for k, v in answer["headers"].items() if k in COMPARED_HEADERS or k == "last-modified"}
    body = answer["body"].decode("utf-8", "replace")
    body = re.sub(r"req-[0-9a-f-]{36}", "req-ID", body)
    return f"{answer['status']} {json.dumps(headers)}\n      {body[:1500]}"


def group(request: dict, ref: dict, ours: dict) -> tuple[str, str, str]:
    return (request["method"], route_template(request["path"]), f"{ref['status']}/{ours['status']}")


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="tools/difftest", description=__doc__)
    parser.add_argument("--seed", default="1", help="a seed or a range: 7, 1..5 (default 1)")
    parser.add_argument("--requests", type=int, default=500, help="requests per seed (default 500)")
    parser.add_argument("--microversion", default="1.0-1.39", help="range of microversions, e.g. 1.14-1.39")
    parser.add_argument("--keep", metavar="DIR", help="keep the servers' directories (logs, databases) in DIR")
    parser.add_argument("--ours-url", help="an already running Allotment (no shrinking then)")
    parser.add_argument("--ref-url", help="an already running reference (no shrinking then)")
    parser.add_argument("--shrink", type=int, default=3, metavar="N",
                        help="shrink the first N divergences to minimal repros (default 3; 0: none)")
    parser.add_argument("--shrink-budget", type=int, default=60, help="replays per shrink (default 60)")
    parser.add_argument("--suite-profile", action="store_true",
                        help="leave out request shapes with known divergences fixed elsewhere (as the test suite)")
    args = parser.parse_args(argv)
    # A TERM (a timeout, a CI cancel) unwinds normally, so the servers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    outcome = run(args)
    return 1 if outcome["divergences"] else 0


def parse_seeds(text: str) -> list[int]:
    if ".." in text:
        low, high = text.split("..")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def parse_versions(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    high = high or low
    return int(low.split(".")[1]), int(high.split(".")[1])


def run(args, out=print) -> dict:
    seeds = parse_seeds(str(args.seed))
    versions = parse_versions(args.microversion)
    profile = Profile(suite=args.suite_profile)
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="allotment-difftest-"))
    workdir.mkdir(parents=True, exist_ok=True)
    runner = Run(workdir, ours_url=args.ours_url, ref_url=args.ref_url)
    groups: collections.Counter = collections.Counter()
    total, examples, shrunk = 0, {}, 0
    crashes: collections.Counter = collections.Counter()
    reshapes: collections.Counter = collections.Counter()  # the reference's answers to POST /reshaper
    dropped_anchors = outside_in_tree = 0
    started = time.monotonic()
    try:
        for seed in seeds:
            stream, divergent, answers = runner.generate_and_run(seed, args.requests, versions, profile)
            total += len(stream)
            if args.keep:
                with open(workdir / f"stream-{seed}.txt", "w") as kept:
                    for index, (request, (ref, ours)) in enumerate(zip(stream, answers)):
                        kept.write(f"{index} {ref['status']}/{ours['status']} {curl(request)}\n")
            out(f"seed {seed}: {len(stream)} requests, {len(divergent)} divergences")
            for request, (ref, _) in zip(stream, answers):
                if request["method"] == "POST" and request["path"] == "/reshaper":
                    errors = (decode(ref) or {}).get("errors") if ref["status"] >= 400 else None
                    code = (errors[0].get("code") if isinstance(errors, list) and errors
                            and isinstance(errors[0], dict) else None)
                    reshapes[f"{ref['status']} {code}" if code else str(ref["status"])] += 1
            for index in runner.crashes:
                request, (ref, _) = stream[index], answers[index]
                crashes[(request["method"], route_template(request["path"]), ref["status"])] += 1
            dropped_anchors += len(runner.dropped_anchors)
            outside_in_tree += len(runner.outside_in_tree)
            for index in divergent:
                key = group(stream[index], *answers[index])
                groups[key] += 1
                if key in examples:
                    continue
                examples[key] = (seed, index)
                repro = stream[:index + 1]
                can_shrink = not (args.ours_url or args.ref_url)
                if can_shrink and shrunk < args.shrink:
                    shrunk += 1
                    repro = runner.shrink(repro, args.shrink_budget)
                    ref, ours, still = runner.replay(repro)
                else:
                    ref, ours = answers[index]
                    repro = [stream[index]]
                out(f"\n--- divergence {key[0]} {key[1]} {key[2]} (seed {seed}, request {index}); "
                    f"repro in {len(repro)} requests:")
                for request in repro:
                    out("  " + curl(request))
                out(f"  reference: {show(ref)}\n  allotment: {show(ours)}")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    out(f"\ndifftest: {total} requests, seeds {args.seed}, microversions {args.microversion}, "
        f"{sum(groups.values())} divergences in {len(groups)} groups ({time.monotonic() - started:.0f} s)")
    for (method, template, statuses), count in sorted(groups.items()):
        out(f"  {count:5d}  {method} {template}  {statuses}")
    if reshapes:
        out("POST /reshaper (compared like every request), the reference's answers: "
            + ", ".join(f"{key} x{count}" for key, count in sorted(reshapes.items())))
    if crashes:
        out(f"not compared: {sum(crashes.values())} answers where the reference failed (5xx) or its "
            "candidates do not add up to the request (200)")
        for (method, template, status), count in sorted(crashes.items()):
            out(f"  {count:5d}  {method} {template}  reference {status}")
    if dropped_anchors:
        out(f"not compared: {dropped_anchors} GET /allocation_candidates answers where the reference "
            "kept fewer of the trees an unsuffixed group served by sharing providers alone can pair with "
            "(set order; docs/differences.md)")
    if outside_in_tree:
        out(f"not compared: {outside_in_tree} GET /allocation_candidates answers where the reference "
            "mapped a resourceless group to a provider outside the tree its in_tree names (docs/differences.md)")
    return {"requests": total, "divergences": sum(groups.values()), "groups": groups,
            "dropped_anchors": dropped_anchors, "outside_in_tree": outside_in_tree}
