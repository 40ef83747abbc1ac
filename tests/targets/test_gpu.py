"""On a machine with a CUDA GPU and a CUDA build of torch only (skipped elsewhere by the
`gpu` marker hook in tests/conftest.py). scripts/gpu_check.sh runs these and the GPT
training check."""

from __future__ import annotations

import copy

import pytest
import torch

import sdk
from torchfarm.fx.fingerprint import local_fingerprint, local_target
from torchfarm.testing.stack import LocalStack

pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.slow]


def test_local_cuda_target_is_the_device_capability():
    major, minor = torch.cuda.get_device_capability(0)
    t = local_target("cuda")
    if torch.version.hip:
        assert t.device == "rocm" and t.arch.startswith("gfx")
    else:
        assert str(t) == f"cuda:sm_{major}{minor}"
    fp = local_fingerprint("cuda")
    assert (fp.device, fp.arch) == (t.device, t.arch)


@pytest.fixture(scope="module")
def cuda_stack(tmp_path_factory):
    with LocalStack(warmup=False, workers=1, workdir=tmp_path_factory.mktemp("cuda"),
                    extra_env={"TORCHFARM_TARGETS": "local"}) as s:
        yield s


def test_cuda_graph_through_the_farm_matches_eager(cuda_stack, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "client"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
    x = torch.randn(32, 64, device="cuda")
    eager = copy.deepcopy(model)
    compiled = sdk.compile(model, remote=cuda_stack.address, fallback="error")
    loss = compiled(x).pow(2).mean()
    loss.backward()
    ref = eager(x).pow(2).mean()
    ref.backward()
    torch.testing.assert_close(loss, ref, atol=1e-4, rtol=1e-4)
    for a, b in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-3, rtol=1e-3)
