"""A kernel request names each constexpr once. The kernel key sorts the (name, value)
pairs while Triton would get the last value of a name, so `[B=16, B=32]` and
`[B=32, B=16]` would share a key and compile differently: a name given twice is refused,
by the check the coordinator runs before anything is queued and the worker runs again."""

from __future__ import annotations

import asyncio

import pytest

from localfarm.fakes import InlineDispatcher, memory_store
from services.coordinator.errors import InvalidRequest
from services.coordinator.farm import Farm
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.triton_rpc import KernelService
from torchfarm.kernels import triton_check, triton_request
from torchfarm.v1 import farm_pb2
from torchfarm.wire.codes import Reason

SOURCE = "import triton\nimport triton.language as tl\n\n@triton.jit\ndef k(x, B: tl.constexpr):\n    pass\n"


def _request(*values: str) -> farm_pb2.KernelRequest:
    request = triton_request.build_kernel_request(
        SOURCE, "k", target="cuda:sm_90", signature="*fp32,constexpr", constexprs={"B": 1}, triton_version="3.1.0",
    )
    del request.constexprs[:]
    for value in values:
        request.constexprs.add(name="B", json_value=value)
    return request


@pytest.mark.parametrize("values", [("16", "32"), ("32", "16"), ("16", "16")])
def test_a_constexpr_named_twice_is_refused(values):
    checked = triton_check.check_kernel_source(SOURCE, "k")
    with pytest.raises(triton_check.KernelRejected, match="'B' is given twice"):
        triton_check.check_signature(_request(*values), checked)


def test_a_constexpr_named_once_is_taken():
    checked = triton_check.check_kernel_source(SOURCE, "k")
    assert triton_check.check_signature(_request("16"), checked)[1] == {"B": 16}


def test_the_coordinator_refuses_it_before_anything_is_queued():
    store = memory_store()
    farm = Farm(CoordinatorSettings(poll_interval_s=0.01), store, InlineDispatcher())
    request = _request("16", "32")
    with pytest.raises(InvalidRequest, match="given twice") as refused:
        asyncio.run(KernelService(farm, farm.runner).compile(request, request.ByteSize()))
    assert refused.value.reason == Reason.INVALID_KERNEL
    assert farm.dispatcher.sent == []
