"""Text in a graph's arguments, where Inductor writes it into source unescaped: an
assert's message into a C++ string literal (`throw std::runtime_error("{msg}")`), a
fallback op's string argument into AOTInductor's C++ wrapper (`"{val}"`). A graph whose
text held a quote wrote C++ and assembly into a kernel the worker compiled and signed: an
`.incbin` of a file the compiler could read, a constructor run where the kernel loads
(torchfarm/graph/textcheck.py). An honest assert's message, quotes and all, still
reaches the farm: the SDK's encoder makes it one the farm takes."""

from __future__ import annotations

import copy

import pytest
import torch

from localfarm.fakes import InProcessFarm
from sdk.backend import build_request
from sdk.errors import GraphRejected
from tests.graphs import captured_graph
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.graph import textcheck
from torchfarm.graph.graph_errors import MalformedGraph
from torchfarm.graph.graphcheck import validate_graph
from torchfarm.v1 import graph_pb2
from torchfarm.wire import keys

BREAKOUT = 'x"), 0));\nasm(".incbin \\"/etc/hostname\\"");\n(0 ? 0 : (throw std::runtime_error("y'


def _texts(graph: graph_pb2.Graph) -> list[graph_pb2.Argument]:
    found = []
    for node in graph.nodes:
        for arg in [*node.args, *(kw.value for kw in node.kwargs)]:
            if arg.WhichOneof("kind") == "str_value":
                found.append(arg)
    return found


def _asserting(x):
    torch._assert_async((x < 2).all(), 'need "small" values\\n here')
    return x.sin() + 1


@pytest.fixture(scope="module")
def asserting() -> graph_pb2.Graph:
    return captured_graph(_asserting, torch.randn(8) * 0.1)


@pytest.fixture(scope="module")
def segments() -> graph_pb2.Graph:
    return captured_graph(lambda x: torch.segment_reduce(x, "sum", lengths=torch.tensor([2, 2])), torch.randn(4))


def test_an_honest_message_reaches_the_farm_quotes_and_all(asserting):
    [message] = _texts(asserting)
    assert message.str_value == "need 'small' values/n here"
    validate_graph(asserting)


def test_a_message_that_leaves_its_string_literal_is_refused(asserting):
    hostile = copy.deepcopy(asserting)
    _texts(hostile)[0].str_value = BREAKOUT
    with pytest.raises(MalformedGraph, match="message"):
        validate_graph(hostile)


@pytest.mark.parametrize("text", ['sum"/*', "sum\\", "sum\n", "sum(0)", "sum;", "mean{}", "a'b", "s" * 300])
def test_other_text_is_plain(segments, text):
    [mode] = _texts(segments)
    assert mode.str_value == "sum"
    validate_graph(segments)
    hostile = copy.deepcopy(segments)
    _texts(hostile)[0].str_value = text
    with pytest.raises(MalformedGraph, match="text"):
        validate_graph(hostile)


def test_the_text_real_graphs_hold_passes():
    graph = captured_graph(
        lambda x: torch.einsum("ij,jk->ik", x, x) + torch.nn.functional.gelu(x, approximate="tanh")
        + torch.einsum("...ij, ...jk -> ...ik", x, x),
        torch.randn(3, 3),
    )
    assert sorted(a.str_value for a in _texts(graph)) == ["...ij, ...jk -> ...ik", "ij,jk->ik", "tanh"]
    validate_graph(graph)


def test_as_message_keeps_a_message_within_bounds():
    message = textcheck.as_message('a "b" \\ c\x1b' + "d" * 5000)
    textcheck.check_text(message, "t", message=True)
    assert message.startswith("a 'b' / c ") and len(message) == textcheck.MAX_MESSAGE_CHARS


def test_the_farm_refuses_the_breakout_before_any_worker_compiles_it(asserting):
    hostile = copy.deepcopy(asserting)
    _texts(hostile)[0].str_value = BREAKOUT
    farm = InProcessFarm()
    farm.register_worker()
    request = build_request(hostile, local_fingerprint("cpu"), "", {}, "breakout")
    with pytest.raises(GraphRejected, match="message"):
        farm.client().submit_and_wait(request, None, keys.compute_key(request, ""))
    assert not farm.store.recent_jobs()
