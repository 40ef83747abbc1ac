"""A failure of the SDK's own encoder, other than the format's refusal, is a bug in
torchfarm; it must not fail a call a local compile serves. Found on a jagged nested
tensor passed between graphs, whose ragged size made the encoder raise TypeError from
inside Dynamo's backend call, with fallback "local"."""

from __future__ import annotations

import logging

import pytest
import torch

from localfarm.fakes import InProcessFarm
from sdk import backend as backend_module
from sdk.backend import FarmBackend
from sdk.errors import GraphRejected


def _broken_encoder(*args, **kwargs):
    raise TypeError("Cannot convert symbols to int")


@pytest.fixture
def farm(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(backend_module, "encode_graph", _broken_encoder)
    torch._dynamo.reset()
    yield InProcessFarm()
    torch._dynamo.reset()


def test_with_fallback_local_the_graph_compiles_here_and_the_bug_is_reported(farm, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    model, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    out = torch.compile(model, backend=FarmBackend(farm.sdk_settings(), client=farm.client()))(x)
    torch.testing.assert_close(out, model(x))
    records = [r for r in caplog.records if r.name == "sdk.backend"]
    bug = [r for r in records if "a bug in torchfarm's SDK; please report it" in r.getMessage()]
    assert bug and bug[0].levelno == logging.WARNING and bug[0].exc_info is not None
    assert any("compiled locally in" in r.getMessage() and "TypeError: Cannot convert symbols to int"
               in r.getMessage() for r in records), [r.getMessage() for r in records]


def test_with_fallback_error_it_is_raised_as_a_refusal_naming_the_failure(farm):
    model = torch.nn.Linear(4, 4)
    compiled = torch.compile(model, backend=FarmBackend(farm.sdk_settings(fallback="error"), client=farm.client()))
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as raised:
        compiled(torch.randn(2, 4))
    inner = raised.value.inner_exception
    assert isinstance(inner, GraphRejected)
    assert "encoding it failed (TypeError: Cannot convert symbols to int)" in str(inner)
