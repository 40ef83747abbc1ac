"""A build holds only what changes an artifact of its target (torchfarm/wire/builds.py): a CPU
artifact's names no Triton, so a CPU client without Triton, or with another patch
release of it, reaches the same workers and keys as the workers' own environment."""

from __future__ import annotations

import importlib.metadata

import pytest

from torchfarm.fx.fingerprint import build_fields, fingerprint_for
from torchfarm.wire import builds, targets
from workers import identity


def _triton() -> str:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("Triton is not installed here: nothing to leave out")


def test_a_cpu_build_names_no_triton_where_triton_is_installed():
    _triton()
    cpu = fingerprint_for(targets.make("cpu", "avx2"))
    assert cpu.triton_version == ""
    assert "no triton" in builds.label(build_fields(cpu))


@pytest.mark.parametrize("target", ["cuda:sm_90", "rocm:gfx942", "mps"])
def test_only_targets_whose_artifacts_hold_triton_kernels_name_it(target):
    version = _triton()
    t = targets.parse(target)
    assert fingerprint_for(t).triton_version == (version if t.device in ("cuda", "rocm") else "")


def test_a_cpu_worker_that_takes_kernel_jobs_registers_its_triton_beside_its_build():
    version = _triton()
    cpu, sm90 = targets.make("cpu", "avx2"), targets.parse("cuda:sm_90")
    both = identity.registration([cpu], [sm90])
    assert both["fingerprint"]["triton_version"] == "" and both["triton"] == version
    assert identity.registration([cpu], [])["triton"] is None
    kernels_only = identity.registration([], [sm90])
    assert kernels_only["fingerprint"]["triton_version"] == version


def test_the_coordinator_keys_kernels_on_the_registered_triton():
    from services.coordinator.triton_rpc import _with_triton_version
    from torchfarm.v1 import farm_pb2

    worker = {"targets": {"cpu:avx2": ["graph"], "cuda:sm_90": ["kernel"]},
              "fingerprint": {"triton_version": ""}, "triton": "3.7.0"}
    out = _with_triton_version(farm_pb2.KernelRequest(), "cuda:sm_90", {"w": worker})
    assert out.triton_version == "3.7.0"
