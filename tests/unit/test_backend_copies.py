"""A compiled module is copied and saved as users copy and save one that torch.compile
made: `copy.deepcopy` (an EMA model), `torch.save` of the whole module, `pickle`. Each
failed on the farm's backend ("no default __reduce__ due to non-trivial __cinit__": its
gRPC channel) where torch.compile's succeed. A copy compiles through the same backend; a
pickle carries what the call gave, never a token, and is made again from the loading
process's settings."""

from __future__ import annotations

import copy
import io
import logging
import pickle

import pytest
import torch
from torch import nn

from localfarm.fakes import InProcessFarm
from sdk.backend import FarmBackend
from sdk.settings import SDKSettings
from torchfarm.trust import tokens

pytestmark = pytest.mark.slow


def _farm_backends(obj: object, depth: int = 6) -> list[FarmBackend]:
    """The FarmBackends within `depth` attributes of `obj` (Dynamo's wrappers of it)."""
    if isinstance(obj, FarmBackend):
        return [obj]
    if depth == 0 or not hasattr(obj, "__dict__"):
        return []
    return [b for value in vars(obj).values() for b in _farm_backends(value, depth - 1)]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))


def test_a_deep_copy_compiles_on_the_farm_as_the_original_does(compiling_farm: InProcessFarm) -> None:
    backend = FarmBackend(compiling_farm.sdk_settings(fallback="error"), client=compiling_farm.client())
    compiled = torch.compile(_model(), backend=backend)
    x = torch.randn(4, 8)
    compiled(x)
    ema = copy.deepcopy(compiled)
    with torch.no_grad():
        for p in ema.parameters():
            p.mul_(0.5)  # the copy's weights are its own
    torch.testing.assert_close(ema(x), ema._orig_mod(x))
    torch.testing.assert_close(compiled(x), compiled._orig_mod(x))
    assert ema(x).sub(compiled(x)).abs().max() > 0


def test_a_pickled_compiled_module_carries_no_token_and_loads_with_a_backend_of_its_own(monkeypatch) -> None:
    loader = tokens.new_token("loader")
    monkeypatch.setenv("TORCHFARM_TOKEN", loader)
    token = tokens.new_token("team")
    settings = SDKSettings(remote="grpc://farm.example:50051", token=token, fallback="local")
    compiled = torch.compile(_model(), backend=FarmBackend(settings, mode="max-autotune-no-cudagraphs", name="M"))
    saved = io.BytesIO()
    torch.save(compiled, saved)
    assert token.encode() not in saved.getvalue()
    assert token.encode() not in pickle.dumps(compiled)
    loaded = torch.load(io.BytesIO(saved.getvalue()), weights_only=False)
    [backend] = {id(b): b for b in _farm_backends(loaded.dynamo_ctx)}.values()
    assert backend.settings.remote == "grpc://farm.example:50051" and backend.settings.fallback == "local"
    assert backend.settings.token == loader  # the loading process's own
    assert backend.mode == "max-autotune-no-cudagraphs" and backend.name == "M"


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.lin(x)) + x


def _graphs_of_blocks_compiled_one_by_one(compile_block) -> int:
    """How many graphs Dynamo compiles for 12 identical blocks compiled separately, as
    torchtitan and FSDP2 code compiles each transformer block."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    x = torch.randn(4, 16)
    for block in [compile_block(Block()) for _ in range(12)]:
        x = block(x)
    return counters["stats"]["unique_graphs"]


def test_blocks_compiled_one_by_one_share_their_graphs_as_torch_compiles_do(compiling_farm: InProcessFarm) -> None:
    # Each sdk.compile made a backend Dynamo found unequal to the last: every block was a
    # recompile of the same code, and past the recompile limit (8) the rest ran eagerly.
    settings, client = compiling_farm.sdk_settings(fallback="error"), compiling_farm.client()
    local = _graphs_of_blocks_compiled_one_by_one(torch.compile)
    names = iter(range(12))  # blocks compiled at different lines are named apart
    farm = _graphs_of_blocks_compiled_one_by_one(
        lambda block: torch.compile(block, backend=FarmBackend(settings, name=f"Block {next(names)}", client=client))
    )
    assert farm == local <= 2
    # A backend that swaps compiled graphs in (wait=False) keeps its own.
    assert FarmBackend(settings, name="Block", client=client, wait=False) != FarmBackend(
        settings, name="Block", client=client, wait=False
    )


def test_blocks_given_to_sdk_compile_one_by_one_share_their_graphs(monkeypatch) -> None:
    import sdk
    from localfarm.stack import free_port

    # A farm that is down: each graph compiles here, and what counts is Dynamo's cache.
    monkeypatch.setenv("TORCHFARM_REMOTE", f"grpc://127.0.0.1:{free_port()}")
    local = _graphs_of_blocks_compiled_one_by_one(torch.compile)
    assert _graphs_of_blocks_compiled_one_by_one(sdk.compile) == local <= 2


def test_a_pickled_model_that_swapped_graphs_in_loads_compiling_before_it_runs(caplog) -> None:
    # wait=False swaps at a hook on the compiled module, which its pickle does not
    # carry: loaded, its graphs ran eagerly for good. It loads waiting for each compile.
    settings = SDKSettings(remote="grpc://farm.example:50051", fallback="local")
    compiled = torch.compile(_model(), backend=FarmBackend(settings, name="M", wait=False))
    with caplog.at_level(logging.INFO, logger="sdk.backend"):
        loaded = pickle.loads(pickle.dumps(compiled))
    [backend] = {id(b): b for b in _farm_backends(loaded.dynamo_ctx)}.values()
    assert backend.swapper is None
    assert "waits for each graph's compile" in caplog.text
