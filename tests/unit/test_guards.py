"""The shape-guard wire form (torchfarm/fx/guards.py), and the torch 2.13 internals it relies on."""

from __future__ import annotations

import json

import pytest
import sympy
import torch
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
from torch.utils._sympy import functions as F

from torchfarm.fx import guards
from torchfarm.fx.guards import GuardError
from torchfarm.wire.manifest import BlobRef, Manifest

s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
w0, w1 = sympy.symbols("w7 w9", integer=True, positive=True)  # the worker's names
TO_CLIENT = {w0: "s0", w1: "s1"}
CLIENT = {"s0": s0, "s1": s1}

EXPRESSIONS = [
    sympy.Le(w0, 4096),
    sympy.Eq(F.Mod(w0 * w1, 8), 0),
    sympy.Ne(F.FloorDiv(w0, 2), 1),
    sympy.Gt(F.Max(1, w0 * w1), 1),
    sympy.And(sympy.Ge(w0, 2), sympy.Lt(w1, 2**31)),
    sympy.Or(sympy.Eq(w0, 1), sympy.Not(sympy.Eq(w1, 0))),
    sympy.Eq(F.Min(w0, w1) + 3 * w0**2, 7),
    sympy.Le(sympy.Rational(1, 2) * w0, w1),
    # interpolate(scale_factor=1.5) under dynamic shapes: a size through floats.
    sympy.Eq(F.TruncToInt(sympy.Float(1.5) * F.ToFloat(w0)), w1),
    sympy.Ge(F.FloorToInt(F.FloatTrueDiv(F.ToFloat(w0), sympy.Float(0.1))) + F.CeilToInt(F.ToFloat(w1)), 2),
]


@pytest.mark.parametrize("expr", EXPRESSIONS, ids=str)
def test_round_trip_renames_symbols(expr):
    tree = guards.encode(expr, TO_CLIENT)
    tree = json.loads(json.dumps(tree))  # what the manifest carries
    back = guards.decode(tree, CLIENT)
    assert back == expr.xreplace({w0: s0, w1: s1})


def test_holds_evaluates_at_hints():
    expr = guards.decode(guards.encode(sympy.Le(w0, 4096), TO_CLIENT), CLIENT)
    assert guards.holds(expr, {s0: 4096})
    assert not guards.holds(expr, {s0: 4097})
    with pytest.raises(GuardError, match="does not evaluate"):
        guards.holds(expr, {s1: 3})


def test_unknown_worker_symbol_is_not_encoded():
    stranger = sympy.Symbol("u0", integer=True)
    with pytest.raises(GuardError, match="not one of the graph's symbols"):
        guards.encode(sympy.Le(stranger, 3), TO_CLIENT)


def test_node_kind_outside_the_allow_list_is_not_encoded():
    with pytest.raises(GuardError, match="does not carry"):
        guards.encode(sympy.Le(sympy.sin(w0), 1), TO_CLIENT)


@pytest.mark.parametrize(
    "tree, message",
    [
        (["Symbol", "s9"], "not a symbol of this graph"),
        (["Le", ["Symbol", "s0"], ["Integer", "4"]], "not an integer"),
        (["Le", ["Symbol", "s0"], ["Integer", 2**70]], "bits"),
        (["Le", ["Symbol", "s0"], ["Integer", True]], "not an integer"),
        (["Eval", ["Symbol", "s0"]], "not allowed"),
        (["__import__", ["Integer", 1]], "not allowed"),
        (["Le", ["Symbol", "s0"]], "operands"),
        (["Pow", ["Symbol", "s0"], ["Integer", 10**6]], "exponent"),
        (["Pow", ["Integer", 2], ["Symbol", "s0"]], "exponent"),
        (["Rational", 1, 0], "divides by zero"),
        (["Le", ["Symbol", "s0"], ["Float", "1.5"]], "not a float"),
        (["Le", ["Symbol", "s0"], ["Float", 1]], "not a float"),
        (["Le", ["Symbol", "s0"], ["Float", float("inf")]], "number"),
        (["Add", ["Symbol", "s0"], ["Integer", 1]], "not a condition"),
        ("s0 <= 4", "malformed"),
        ([], "malformed"),
        ({"Le": 1}, "malformed"),
    ],
    ids=lambda v: str(v)[:30],
)
def test_bad_trees_are_refused(tree, message):
    with pytest.raises(GuardError, match=message):
        guards.decode(tree, CLIENT)


def test_deep_and_large_trees_are_refused():
    deep: list = ["Symbol", "s0"]
    for _ in range(guards.MAX_DEPTH + 1):
        deep = ["Not", deep]
    with pytest.raises(GuardError, match="deeper"):
        guards.decode(deep, CLIENT)
    wide = ["And", *(["Le", ["Symbol", "s0"], ["Integer", i]] for i in range(guards.MAX_TREE_NODES))]
    with pytest.raises(GuardError, match="more than"):
        guards.decode(wide, CLIENT)
    with pytest.raises(GuardError, match="more than"):
        guards.decode_all([["True"]] * (guards.MAX_GUARDS + 1), CLIENT)


def test_manifest_carries_guards_and_omits_none():
    payload = BlobRef("sha256:" + "0" * 64, 1)
    plain = Manifest(key="k", fingerprint={}, payload=payload)
    assert b"guards" not in plain.to_json()
    tree = guards.encode(sympy.Le(w0, 4096), TO_CLIENT)
    with_guards = Manifest(key="k", fingerprint={}, payload=payload, guards=(tree,))
    assert Manifest.from_json(with_guards.to_json()).guards == (tree,)
    # The signature covers every field but itself, so the guards too.
    assert with_guards.signing_bytes() != plain.signing_bytes()


# -- torch internals relied on (torch 2.13) ---------------------------------------------


def _env_with_symbol(hint: int) -> tuple[ShapeEnv, sympy.Symbol]:
    from torch._dynamo.source import ConstantSource

    env = ShapeEnv()
    sym = env.create_symbol(hint, source=ConstantSource("x"), dynamic_dim=DimDynamic.DYNAMIC)
    return env, sym


def test_snapshot_and_added_since_see_new_guards_only():
    env, sym = _env_with_symbol(8)
    env.evaluate_expr(sympy.Ne(sym, 3))
    mark = guards.snapshot(env)
    env.evaluate_expr(sympy.Le(sym, 4096))
    env.evaluate_expr(sympy.Le(sym, 4096))
    assert guards.added_since(env, mark) == [sympy.Le(sym, 4096)]


def test_install_adds_a_guard_dynamo_reads():
    env, sym = _env_with_symbol(8)
    assert env.backed_var_to_val[sym] == 8
    before = len(env.guards)
    guards.install(env, [sympy.Le(sym, 4096)])
    assert [g.expr for g in env.guards[before:]] == [sympy.Le(sym, 4096)]


def test_shipped_guard_makes_dynamo_recompile():
    """A guard installed from the backend joins the frame's guards (sdk/backend.py)."""
    from torchfarm.fx.encode import encode_graph

    hints = []

    def backend(gm, example_inputs):
        graph = encode_graph(gm, example_inputs)
        shapes = guards.CaptureShapes.of(gm, [s.name for s in graph.symbols])
        hints.append(sorted(shapes.hints.values()))
        ships = shapes.read([["Le", ["Symbol", graph.symbols[0].name], ["Integer", 10]]])
        if not shapes.false_ones(ships):
            shapes.install(ships)
        return gm.forward

    torch._dynamo.reset()
    f = torch.compile(lambda x: x.sin() + 1, backend=backend, dynamic=True)
    for n in (4, 8, 12, 9):
        f(torch.randn(n))
    torch._dynamo.reset()
    assert hints == [[4], [12]]  # 8 passes the guard; 12 fails it; 9 passes the guard-free graph


def test_a_call_guard_checks_each_call_from_its_size_inputs():
    """wait=False: the frame's guards are built before the artifact arrives, so the
    artifact's guards are checked at each call, from the graph's SymInt inputs."""
    from torchfarm.fx.encode import encode_graph

    seen = []

    def backend(gm, example_inputs):
        graph = encode_graph(gm, example_inputs)
        shapes = guards.CaptureShapes.of(gm, [s.name for s in graph.symbols])
        symbol = shapes.symbols[graph.symbols[0].name]
        check = shapes.call_guard([sympy.Le(symbol, 10)])
        seen.append(check)
        return lambda *args: (check.admits(args), gm.forward(*args))[1]

    torch._dynamo.reset()
    f = torch.compile(lambda x: x.sin() + 1, backend=backend, dynamic=True)
    for n in (4, 12, 9):
        f(torch.randn(n))
    torch._dynamo.reset()
    [check] = seen  # the size is the graph's first input, the tensor its second
    assert [check.admits([n, None]) for n in (4, 12, 10, 4)] == [True, False, True, True]


def test_a_guard_on_a_size_no_input_carries_is_refused_for_calls():
    shapes = guards.CaptureShapes(None, {}, {}, {})
    with pytest.raises(guards.GuardError, match="from no input of its own"):
        shapes.call_guard([sympy.Le(sympy.Symbol("s9", positive=True, integer=True), 10)])
