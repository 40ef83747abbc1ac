"""torchfarm/fx/fingerprint.py: the local target detected from torch, and fingerprints serialized.

GPUs are simulated by replacing the torch.cuda / torch.xpu / torch.backends.mps calls
that detection makes; the real CUDA path runs in test_gpu.py where a GPU exists.
"""

from __future__ import annotations

import types

import pytest
import torch

from torchfarm.fx import fingerprint as sdk_target
from torchfarm.fx.fingerprint import Fingerprint, device_kind, local_target, local_targets, resolve
from torchfarm.wire.targets import TargetError


def test_cpu_target_is_atens_isa():
    t = local_target("cpu")
    assert t.device == "cpu"
    assert t.isa == torch.backends.cpu.get_cpu_capability().lower().replace(" ", "")
    assert local_targets()[0] == t
    assert resolve("cpu") == t and resolve("cuda:sm_90").arch == "sm_90"


def _fake_cuda(monkeypatch, *, hip: str | None, props: dict) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: types.SimpleNamespace(**props))
    monkeypatch.setattr(torch.version, "hip", hip)


def test_cuda_capability_becomes_sm_arch(monkeypatch):
    _fake_cuda(monkeypatch, hip=None, props={"major": 9, "minor": 0, "gcnArchName": ""})
    assert str(local_target("cuda")) == "cuda:sm_90"
    assert str(local_target()) == "cuda:sm_90"  # the accelerator wins over the CPU
    assert [str(t) for t in local_targets()][1:] == ["cuda:sm_90"]
    assert str(resolve("cuda")) == "cuda:sm_90"
    with pytest.raises(TargetError, match="CUDA build, not a ROCm"):
        local_target("rocm")


def test_hip_gcn_arch_name_becomes_rocm_target(monkeypatch):
    _fake_cuda(monkeypatch, hip="6.4", props={"major": 9, "minor": 4, "gcnArchName": "gfx942:sramecc+:xnack-"})
    assert str(local_target("cuda")) == "rocm:gfx942"  # ROCm torch calls its device "cuda"
    assert str(local_target("rocm")) == "rocm:gfx942"
    fp = sdk_target.fingerprint_for(local_target("rocm"))
    assert (fp.device, fp.arch) == ("rocm", "gfx942")


def test_mps_and_xpu(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert str(local_target("mps")) == "mps"
    xpu = types.SimpleNamespace(
        is_available=lambda: True, current_device=lambda: 0,
        get_device_properties=lambda i: types.SimpleNamespace(name="Intel(R) Data Center GPU Max 1550"),
    )
    monkeypatch.setattr(torch, "xpu", xpu, raising=False)
    assert str(local_target("xpu")) == "xpu:intel-r-data-center-gpu-max-1550"


def test_missing_devices_are_named():
    if not torch.cuda.is_available():
        with pytest.raises(TargetError, match="no cuda device"):
            local_target("cuda")
    with pytest.raises(TargetError, match="unknown device"):
        local_target("tpu")


def test_device_kind_of_graph_inputs():
    assert device_kind([torch.ones(2), 3]) == "cpu"
    assert device_kind([torch.empty(2, device="meta")]) == "cpu"
    assert device_kind([]) == "cpu"


def test_fingerprint_serializes_and_carries_the_target():
    t = local_target("cpu")
    fp = sdk_target.fingerprint_for(t)
    assert Fingerprint.from_dict(fp.to_dict()) == fp
    assert (fp.device, fp.arch, fp.isa) == ("cpu", "", t.isa)
    gpu = sdk_target.fingerprint_for(resolve("cuda:sm_90"))
    assert (gpu.device, gpu.arch) == ("cuda", "sm_90")
    # Same build, other target; only a Triton target's build names Triton
    # (tests/unit/test_build_identity.py).
    cpu_build, gpu_build = sdk_target.build_fields(fp), sdk_target.build_fields(gpu)
    assert cpu_build["triton_version"] == ""
    assert {**gpu_build, "triton_version": ""} == cpu_build
    with pytest.raises(ValueError, match="missing"):
        Fingerprint.from_dict({"device": "cpu"})
