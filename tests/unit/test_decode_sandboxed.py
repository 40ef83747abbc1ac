"""Decoding is compiling (issue 40, item 1): where a worker compiles in its sandbox, the
pool process, which holds the signing key and the Redis credentials and has no memory
limit, never fake-propagates a tenant's graph; the sandbox's child decodes it."""

from __future__ import annotations

import pytest

from localfarm.inline import InlineDispatcher, worker_context
from localfarm.memory_store import MemoryStore
from sdk.backend import build_request
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.wire import keys
from workers import fakepg
from workers.runtime import JobFailed, prepare
from workers.sandbox import Sandbox

from .test_decode_budget import FN, nested_bodies, one_op


def stored(store: MemoryStore, graph) -> str:  # noqa: ANN001
    request = build_request(graph, local_fingerprint(), "", {}, "t")
    key = keys.compute_key(request, "")
    store.put_request(key, request.SerializeToString(), 60)
    return key


def test_a_sandboxed_job_is_not_decoded_in_the_pool_process(monkeypatch):
    store = MemoryStore.create()
    key = stored(store, nested_bodies(1, 2))
    ctx = worker_context(store, InlineDispatcher(), sandbox=Sandbox(mode="process"))

    def refuse(graph):  # noqa: ANN001, ANN202
        raise AssertionError("the pool process decoded a tenant's graph")

    monkeypatch.setattr(fakepg, "decoded", refuse)
    job = prepare(key, ctx)
    assert job.decoded_graph is None


def test_a_job_compiled_here_is_decoded_here():
    store = MemoryStore.create()
    key = stored(store, nested_bodies(1, 2))
    job = prepare(key, worker_context(store, InlineDispatcher()))
    assert job.decoded_graph is not None


def test_a_sandboxed_job_still_refuses_a_bad_graph_before_the_sandbox():
    store = MemoryStore.create()
    key = stored(store, one_op([1 << 28], FN, "torch.ops.aten.unbind.int"))
    with pytest.raises(JobFailed, match="outputs|sequence"):
        prepare(key, worker_context(store, InlineDispatcher(), sandbox=Sandbox(mode="process")))
