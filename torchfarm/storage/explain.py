"""Why a submit missed: the closest artifact of the same graph or model, and what differs.

A key (torchfarm/wire/keys.py) is one digest, so two requests that miss each other say nothing
about why. Each stored request therefore also leaves a small record of its key's
components, and is indexed under two coarse identities:

- the graph's *structure*: its nodes without the inputs' metadata and its constants, so
  the same graph at other shapes, under another build, target or options, is found;
- the *model*: the request's label up to " from <host>" ("<model> graph <i>"), so the
  same model whose graph changed is found too.

On a miss, `explain` compares the request with each indexed record (newest first) and
takes the closest: the fewest differing components. It names the first that differs in
the order of `COMPONENTS`, and for the graph the first node that differs.

A precompiled package (sdk/precompile.py) has no graph to read: its key covers the
model's code, module tree, parameters and inputs, which only the client sees. The client
sends those components' values or digests with the upload and with a miss
(`PrecompiledRecord`), the record is indexed under the model's root class, and a miss is
explained the same way in the order of `PRECOMPILED_COMPONENTS`, naming the first
differing part (a class, a module, a parameter, an input) where the record has parts.
The records are the client's word, so they are bounded (`check_precompiled`) and serve
only as explanations.

Torch-free, like the key. Redis entries (tenant-scoped like every per-key entry):
`tf:explain:<key>` (the record, JSON), `tf:explainparts:<key>` (a precompiled record's
parts, read for the closest record only), `tf:explainidx:<ns>:<identity>` (a sorted set of
keys by time, the newest `INDEX_SIZE`), `tf:why:<key>` (the last explanation of a miss)
and `tf:whyidx:<ns>` (the namespace's precompiled misses kept, the newest
`MAX_PRECOMPILED_WHYS`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, cast

from torchfarm.v1 import farm_pb2, graph_pb2
from torchfarm.wire import keys

if TYPE_CHECKING:  # the SDK reads this module's bounds and has no redis
    from torchfarm.storage.store import Store

COMPONENTS = (
    "torch_build", "triton", "cpu_isa", "gpu_arch", "compiler", "options", "input_metadata", "graph",
)
"""Key components, in the order a difference is named (a metric label each)."""

PRECOMPILED_COMPONENTS = (
    "torch_build", "triton", "cpu_isa", "gpu_arch", "compiler", "options",
    "model_code", "module_tree", "parameters", "input_metadata",
)
"""A precompiled package's key components, in the order a difference is named."""

REASONS = (*dict.fromkeys(COMPONENTS + PRECOMPILED_COMPONENTS), "evicted", "new")
"""Every reason a miss may have: a component, "evicted" (a record with nothing different:
the artifact was there and left the cache), or "new" (nothing of this graph or model)."""

RECORD_TTL_S = 30 * 24 * 3600
"""How long a request's component record stays findable."""

INDEX_SIZE = 32
"""Records kept per identity, newest first."""

MAX_NODES = 20000
"""Nodes whose digests a record keeps; a graph beyond that compares its first ones only."""

MAX_PARTS = 4096
"""Parts a precompiled record may carry; the client sends its first ones only."""

MAX_TEXT = 256
"""The longest model name, component value, part name or part value a record may carry."""

MAX_RECORD_BYTES = 256 * 1024
"""The largest precompiled record kept (its JSON); a bigger one is kept without its parts,
so a miss names the component that differs but not the part."""

READ_BUDGET_BYTES = 8 * 1024 * 1024
"""Record bytes one explanation reads at most: it compares the newest records of its
identities until this is spent. A precompiled record is read without its parts (some
3 KiB), and only the closest one's parts are read."""

MAX_PRECOMPILED_WHYS = 256
"""Explanations of precompiled misses one namespace keeps, its newest: a precompiled
key is the client's word, so without this each call could keep one more, uncharged."""


def digest(value: Any) -> str:
    """A short SHA-256 of bytes or a JSON value: what a record carries for a long component."""
    text = value if isinstance(value, bytes) else json.dumps(value, sort_keys=True).encode()
    return hashlib.sha256(text).hexdigest()[:16]


def _node_digest(node: graph_pb2.Node) -> str:
    copy = graph_pb2.Node()
    copy.CopyFrom(node)
    copy.ClearField("tensor")
    copy.ClearField("symint")
    copy.ClearField("dtensor")
    return digest(copy.SerializeToString(deterministic=True))


def _node_text(node: graph_pb2.Node) -> str:
    op = graph_pb2.Node.Op.Name(node.op).lower()
    return f"{node.name}: {op} {node.target}".strip()[:120]


def _input_metadata(request: farm_pb2.CompileRequest) -> str:
    graph = request.graph
    if not request.specialize_hints:
        graph = graph_pb2.Graph.FromString(
            graph.SerializeToString()
        )  # a copy: hints cleared below, as the key leaves them out
        for s in graph.symbols:
            s.ClearField("hint")
    parts = [
        (n.name, n.tensor.SerializeToString(deterministic=True).hex(),
         n.symint.expr if n.HasField("symint") else "",
         n.dtensor.SerializeToString(deterministic=True).hex())
        for n in graph.nodes if n.op == graph_pb2.Node.PLACEHOLDER
    ]
    symbols = [(s.name, s.hint, s.min, s.max) for s in graph.symbols]
    # A DTensor graph's rank and meshes are its inputs' too (torchfarm/graph/dtensor.py).
    meshes = [graph.rank, [m.SerializeToString(deterministic=True).hex() for m in graph.meshes]]
    return digest([parts, symbols, request.specialize_hints, *([meshes] if graph.meshes else [])])


@dataclass
class Record:
    """A request's key components: readable values where short, digests otherwise."""

    key: str
    components: dict[str, str]
    nodes: list[str] = field(default_factory=list)
    node_texts: list[str] = field(default_factory=list)
    created: float = 0.0
    parts: list[list[str]] = field(default_factory=list)
    """A precompiled record's [component, name, value] items, in the model's order."""
    model: str = ""
    """A precompiled record's model (its root class): the identity it is indexed under."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, data: bytes | str) -> Record:
        body = json.loads(data)
        return cls(str(body["key"]), dict(body["components"]), list(body["nodes"]),
                   list(body["node_texts"]), float(body["created"]), list(body.get("parts", [])),
                   str(body.get("model", "")))


def record_of(request: farm_pb2.CompileRequest, key: str) -> Record:
    t, b = request.target, request.build
    nodes = request.graph.nodes[:MAX_NODES]
    node_digests = [_node_digest(n) for n in nodes]
    components = {
        "torch_build": f"torch {b.torch_version} ({b.torch_git[:12]}), Python {b.python}, {b.platform}",
        "triton": b.triton_version or "(none)",
        "cpu_isa": t.isa if t.device == "cpu" else "",
        "gpu_arch": f"{t.device}:{t.arch}" if t.device != "cpu" else "",
        "compiler": t.compiler,
        "options": json.dumps(keys.options_canonical(request.options), sort_keys=True),
        "input_metadata": _input_metadata(request),
        "graph": digest([node_digests, [c.SerializeToString(deterministic=True).hex()
                                         for c in request.graph.constants]]),
    }
    if t.device != "cpu":  # a GPU graph's CPU kernels still use the host ISA
        components["cpu_isa"] = t.isa
    return Record(key, components, node_digests, [_node_text(n) for n in nodes], time.time())


def check_precompiled(record: farm_pb2.PrecompiledRecord, key: str) -> Record:
    """The record of a client's `PrecompiledRecord` for `key`; ValueError when it is not
    one a client makes (an unknown component, a text over `MAX_TEXT`, over `MAX_PARTS`)."""
    texts = [record.model, *record.components.values()]
    texts += [t for p in record.parts for t in (p.name, p.value)]
    if not record.model:
        raise ValueError("a precompiled record names no model")
    if any(len(t) > MAX_TEXT for t in texts):
        raise ValueError(f"a precompiled record carries a text over {MAX_TEXT} characters")
    if len(record.parts) > MAX_PARTS:
        raise ValueError(f"a precompiled record has {len(record.parts)} parts, over {MAX_PARTS}")
    unknown = {*record.components, *(p.component for p in record.parts)} - set(PRECOMPILED_COMPONENTS)
    if unknown:
        raise ValueError(f"a precompiled record names unknown components: {sorted(unknown)[:4]}")
    return Record(key, dict(record.components), created=time.time(), model=record.model,
                  parts=[[p.component, p.name, p.value] for p in record.parts])


def _precompiled_identity(record: Record) -> str:
    return "precompiled:" + digest(record.model)


def identities(request: farm_pb2.CompileRequest, record: Record) -> list[str]:
    """The coarse identities a record is indexed under: structure, then model."""
    found = ["structure:" + record.components["graph"]]
    model = request.label.split(" from ")[0].strip()
    if model:
        found.append("model:" + digest(model))
    return found


@dataclass(frozen=True)
class Explanation:
    reason: str
    """One of `REASONS`."""
    closest_key: str = ""
    detail: str = ""
    differs: tuple[str, ...] = ()

    def to_proto(self) -> farm_pb2.MissExplanation:
        return farm_pb2.MissExplanation(
            reason=self.reason, closest_key=self.closest_key, detail=self.detail,
            differs=list(self.differs),
        )


def compare(mine: Record, theirs: Record, order: tuple[str, ...] = COMPONENTS) -> Explanation:
    """What differs between a request's record and another's (the other's key closest),
    components named in `order`."""
    differs = tuple(c for c in order if mine.components.get(c) != theirs.components.get(c))
    if not differs:
        return Explanation("evicted", theirs.key, (
            f"artifact {keys.short(theirs.key)} had the same components; it left the cache "
            "(evicted, expired or refused)"
        ))
    first = differs[0]
    part = _part_detail(mine, theirs, first)
    if first == "graph":
        detail = _graph_detail(mine, theirs)
    elif part:
        detail = part
    elif first in ("input_metadata",):
        detail = "the inputs' shapes, strides, dtypes, devices or kinds differ"
    else:
        detail = f"{theirs.components.get(first)!r} there, {mine.components.get(first)!r} here"
    more = f" (also: {', '.join(differs[1:])})" if differs[1:] else ""
    return Explanation(
        first, theirs.key,
        f"closest artifact {keys.short(theirs.key)} differs in {first}: {detail}{more}", differs,
    )


def _part_detail(mine: Record, theirs: Record, component: str) -> str:
    """The first of `component`'s parts that differs, in the model's order; "" if none."""
    here = {name: value for c, name, value in mine.parts if c == component}
    there = {name: value for c, name, value in theirs.parts if c == component}
    for name in [*here, *(n for n in there if n not in here)]:
        if here.get(name) != there.get(name):
            return f"{name}: {there.get(name, '(none)')!r} there, {here.get(name, '(none)')!r} here"
    return ""


def _graph_detail(mine: Record, theirs: Record) -> str:
    for i, (a, b) in enumerate(zip(mine.nodes, theirs.nodes, strict=False)):
        if a != b:
            return f"first differing node #{i}: {theirs.node_texts[i]!r} there, {mine.node_texts[i]!r} here"
    if len(mine.nodes) != len(theirs.nodes):
        i = min(len(mine.nodes), len(theirs.nodes))
        there = theirs.node_texts[i] if i < len(theirs.nodes) else "(end)"
        here = mine.node_texts[i] if i < len(mine.nodes) else "(end)"
        return f"first differing node #{i}: {there!r} there, {here!r} here"
    return "its constants differ"


class MissIndex:
    """The records and their index in one tenant's view of the store."""

    def __init__(self, store: Store):
        self.store = store

    def _index(self, identity: str) -> str:
        return self.store._k("explainidx", self.store.namespace or "-", identity)

    def remember(self, request: farm_pb2.CompileRequest, key: str) -> None:
        """Records the request's components and indexes them (one pipelined round trip)."""
        record = record_of(request, key)
        self._remember(record, identities(request, record))

    def remember_precompiled(self, record: Record) -> None:
        """Records an uploaded package's components (`check_precompiled`'s) under its model,
        its parts apart (none where they would pass MAX_RECORD_BYTES): an explanation
        ranks every record of the model by its components, and reads the closest's parts."""
        parts = json.dumps(record.parts, separators=(",", ":")) if len(record.to_json()) <= MAX_RECORD_BYTES else ""
        self._remember(dataclasses.replace(record, parts=[]), [_precompiled_identity(record)], parts)

    def explain(self, request: farm_pb2.CompileRequest, key: str) -> Explanation:
        """Why `key` missed: compared with the closest record of its structure or model."""
        mine = record_of(request, key)
        return self._closest(mine, identities(request, mine), COMPONENTS)

    def explain_precompiled(self, record: farm_pb2.PrecompiledRecord, key: str) -> Explanation:
        """Why the precompiled `key` missed: compared with the closest package of its model."""
        mine = check_precompiled(record, key)
        return self._closest(mine, [_precompiled_identity(mine)], PRECOMPILED_COMPONENTS, kept=MAX_PRECOMPILED_WHYS)

    def _remember(self, record: Record, found_under: list[str], parts: str | None = None) -> None:
        """`parts`: a precompiled record's, kept apart ("": none, an earlier upload's dropped)."""
        pipe = self.store.c.pipeline(transaction=False)
        pipe.set(self.store._j("explain", record.key), record.to_json(), ex=RECORD_TTL_S)
        if parts:
            pipe.set(self.store._j("explainparts", record.key), parts, ex=RECORD_TTL_S)
        elif parts is not None:
            pipe.delete(self.store._j("explainparts", record.key))
        for identity in found_under:
            index = self._index(identity)
            pipe.zadd(index, {record.key: record.created})
            pipe.zremrangebyrank(index, 0, -INDEX_SIZE - 1)
            pipe.expire(index, RECORD_TTL_S)
        pipe.execute()

    def _closest(self, mine: Record, found_under: list[str], order: tuple[str, ...], kept: int = 0) -> Explanation:
        """`kept`: how many of the namespace's explanations of this kind to keep (0: each
        lives its TTL; a compile's are bounded by its job quota)."""
        key = mine.key
        if self.store.c.exists(self.store._j("explain", key)):
            result = Explanation("evicted", key, (
                "this very key was stored before; its artifact left the cache "
                "(evicted, expired or refused)"
            ))
            self._keep(key, result, kept)
            return result
        seen: list[str] = []
        for identity in found_under:
            # The store's client never decodes replies: bytes, whatever redis-py's types say.
            others = cast("list[bytes]", self.store.c.zrevrange(self._index(identity), 0, INDEX_SIZE - 1))
            for other in others:
                other_key = other.decode()
                if other_key != key and other_key not in seen:
                    seen.append(other_key)
        best: tuple[Explanation, Record] | None = None
        budget = READ_BUDGET_BYTES
        for other_key in seen:
            if budget <= 0:
                break
            data = self.store.c.get(self.store._j("explain", other_key))
            if data is None:
                continue
            budget -= len(data)
            theirs = Record.from_json(data)
            found = compare(mine, theirs, order)
            if best is None or len(found.differs) < len(best[0].differs):
                best = found, theirs
        if best is not None and mine.parts and not best[1].parts:
            parts = self.store.c.get(self.store._j("explainparts", best[1].key))
            if parts is not None:
                best = compare(mine, dataclasses.replace(best[1], parts=list(json.loads(parts))), order), best[1]
        result = best[0] if best else Explanation("new", "", "no artifact of this graph or model on the farm yet")
        self._keep(key, result, kept)
        return result

    def _keep(self, key: str, result: Explanation, kept: int = 0) -> None:
        pipe = self.store.c.pipeline(transaction=False)
        pipe.set(self.store._j("why", key), json.dumps(asdict(result)), ex=RECORD_TTL_S)
        if not kept:
            pipe.execute()
            return
        index = self.store._k("whyidx", self.store.namespace or "-")
        pipe.zadd(index, {key: time.time()})
        pipe.expire(index, RECORD_TTL_S)
        pipe.zrange(index, 0, -kept - 1)
        # The store's client never decodes replies: bytes, whatever redis-py's types say.
        older = [k.decode() for k in cast("list[bytes]", pipe.execute()[-1])]
        if older:
            pipe.delete(*(self.store._j("why", k) for k in older))
            pipe.zrem(index, *older)
            pipe.execute()

    def last(self, key: str) -> Explanation | None:
        """The explanation of `key`'s last miss, if the farm still has it."""
        data = self.store.c.get(self.store._j("why", key))
        if data is None:
            return None
        body = json.loads(data)
        return Explanation(body["reason"], body["closest_key"], body["detail"], tuple(body["differs"]))
