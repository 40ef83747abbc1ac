"""torchfarm/fx/global_state.py: the grad mode and autocast a graph was captured under,
written into its request on the client and put back around the worker's compile."""

from __future__ import annotations

import pytest
import torch

from torchfarm.fx import global_state
from torchfarm.options import OptionNotAllowed
from torchfarm.v1 import farm_pb2


def _recorded() -> farm_pb2.CompileOptions:
    options = farm_pb2.CompileOptions()
    global_state.record(options)
    return options


def test_record_then_applied_gives_back_the_callers_state():
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        options = _recorded()
    assert options.no_grad and [(a.device_type, a.dtype) for a in options.autocast] == [("cpu", "bfloat16")]
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
    with global_state.applied(options):
        assert not torch.is_grad_enabled() and torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")


def test_the_default_state_records_nothing():
    options = _recorded()
    assert not options.no_grad and not options.autocast


def test_autocast_for_a_device_this_machine_lacks_still_applies():
    """A CPU worker lowering for CUDA: torch.autocast("cuda") would turn itself off here."""
    options = farm_pb2.CompileOptions(autocast=[farm_pb2.Autocast(device_type="cuda", dtype="float16")])
    before = torch.get_autocast_dtype("cuda")
    with global_state.applied(options):
        assert torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.float16
    assert not torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == before


def test_an_unknown_autocast_is_refused_before_anything_changes():
    options = farm_pb2.CompileOptions(no_grad=True, autocast=[farm_pb2.Autocast(device_type="cpu", dtype="int8")])
    with pytest.raises(OptionNotAllowed, match="int8"), global_state.applied(options):
        pass
    assert torch.is_grad_enabled()
