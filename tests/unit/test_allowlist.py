"""The committed allow-list: up to date, canonical, and free of dangerous targets."""

from __future__ import annotations

import importlib.util
import operator
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from torchfarm.fx.decode import resolve_function
from torchfarm.fx.encode import UnsupportedGraph, qualified_name
from torchfarm.graph import denylist, dtensor
from torchfarm.graph.allowlist import (
    is_allowed_attribute,
    is_allowed_function,
    is_allowed_method,
    load_allowlist,
)
from torchfarm.graph.graph_errors import DisallowedOp

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_allowlist", ROOT / "scripts" / "gen_allowlist.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_regenerating_gives_the_committed_file() -> None:
    built_from = load_allowlist().torch_version
    if built_from != torch.__version__:
        # Another build of the pinned version (a CUDA wheel) may register other ops.
        pytest.skip(
            f"allow-list was generated with torch {built_from}, this is {torch.__version__}"
        )
    gen = _generator()
    committed = (ROOT / "torchfarm" / "data" / "allowlist.json").read_text("utf-8")
    assert (
        gen.render(gen.build()) == committed
    ), "run scripts/gen_allowlist.py and commit the result"


def test_a_fresh_process_resolves_every_allowed_function() -> None:
    """As a worker's decode does, first thing in its process: Inductor's own prims
    (prims.fma, which a compiled optimizer step's graph held) exist only once Inductor's
    module is imported, and the job failed with INVALID_GRAPH."""
    if load_allowlist().torch_version != torch.__version__:
        pytest.skip("another torch lacks some of the names; resolve_function refuses those")
    script = (
        "from torchfarm.fx.decode import resolve_function\n"
        "from torchfarm.graph.allowlist import load_allowlist\n"
        "bad = []\n"
        "for name in load_allowlist().functions:\n"
        "    try:\n"
        "        resolve_function(name)\n"
        "    except Exception as e:\n"
        "        bad.append(f'{name}: {e}')\n"
        "print(len(bad), bad[:5])\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1] == "0 []", proc.stdout[-2000:]


def test_pinned_torch() -> None:
    # Generated from the torch the default install pins (pyproject.toml), whichever
    # supported torch runs the tests (make test-second-build runs 2.12).
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [r for r in project["optional-dependencies"]["worker"] if r.startswith("torch==")]
    assert load_allowlist().torch_version.split("+")[0] == pins[0].removeprefix("torch==")


@pytest.mark.parametrize(
    "name",
    [
        "torch._C._nn.linear",
        "torch._C._nn.scaled_dot_product_attention",
        "torch.nn.functional.layer_norm",
        "torch.nn.functional.max_pool2d",
        "torch.arange",
        "torch.conv2d",
        "torch.cat",
        "torch.where",
        "torch.functional.einsum",
        "torch._C._fft.fft_rfft",
        "_operator.getitem",
        "_operator.add",
        "math.sqrt",
        "torch.ops.aten.add.Tensor",
        "torch.ops.aten.sym_size.int",
        "torch.ops.aten._assert_scalar.default",
        "torch._C._set_grad_enabled",
        "torch.amp.autocast_mode._enter_autocast",
        "torch.sym_min",
        "torch._sym_sqrt",
        # what the real-model suite's graphs call (tests/realmodels)
        "torch._weight_norm",
        "torch._C._nn._upsample_nearest_exact2d",
        "builtins.getattr",
    ],
)
def test_allowed_functions(name: str) -> None:
    assert is_allowed_function(name)
    assert callable(resolve_function(name))


@pytest.mark.parametrize(
    "name",
    [
        "torch.load",
        "torch.save",
        "torch.serialization.load",
        "torch.from_file",
        "torch.frombuffer",
        "torch.from_numpy",
        "torch.hub.load",
        "torch.manual_seed",
        "torch.set_default_dtype",
        "torch.compile",
        "torch._VariableFunctionsClass.arange",  # not canonical
        "operator.getitem",  # canonical is _operator.getitem
        "_operator.attrgetter",
        "_operator.methodcaller",
        "_operator.call",
        "math.factorial",
        "builtins.eval",
        "builtins.setattr",
        "builtins.__import__",
        "os.system",
        "pickle.loads",
        "torch.ops.aten.set_.source_Storage",
        "torch.ops.aten.set.source_Storage",
        "torch.ops.aten._print.default",
        "torch.ops.aten.from_file.default",
        "torch.ops.aten._backward.default",
        "torch.ops.aten.record_stream.default",
        "torch._C._has_torch_function",
    ],
)
def test_denied_functions(name: str) -> None:
    assert not is_allowed_function(name)
    with pytest.raises(DisallowedOp, match=name.replace(".", r"\.")):
        resolve_function(name)


@pytest.mark.parametrize(
    "name",
    [
        "view",
        "reshape",
        "transpose",
        "contiguous",
        "split",
        "masked_fill",
        "to",
        "item",
        "__getitem__",
        "__radd__",
        "type",  # x.type(torch.float64) in DeepSeek-V3 and XLNet
    ],
)
def test_allowed_methods(name: str) -> None:
    assert is_allowed_method(name)


@pytest.mark.parametrize(
    "name",
    [
        "storage",
        "untyped_storage",
        "data_ptr",
        "register_hook",
        "register_post_accumulate_grad_hook",
        "retain_grad",
        "backward",
        "apply_",
        "map_",
        "map2_",
        "numpy",
        "tolist",
        "set_",
        "share_memory_",
        "pin_memory",
        "record_stream",
        "as_subclass",
        "new",
        "__reduce_ex__",
        "__reduce__",
        "__setstate__",
        "__getattribute__",
        "__setattr__",
        "__class__",
        "__init__",
        "__torch_function__",
    ],
)
def test_denied_methods(name: str) -> None:
    assert not is_allowed_method(name)


@pytest.mark.parametrize(
    "target, name",
    [
        (torch.arange, "torch.arange"),
        (torch._C._VariableFunctions.arange, "torch.arange"),
        (operator.getitem, "_operator.getitem"),
        (F.gelu, "torch._C._nn.gelu"),
        (F.max_pool2d, "torch.nn.functional.max_pool2d"),
        (F.layer_norm, "torch.nn.functional.layer_norm"),
        (torch.ops.aten.add.Tensor, "torch.ops.aten.add.Tensor"),
        (torch.ops.aten.add, "torch.ops.aten.add"),
        (torch.sym_sqrt, "torch._sym_sqrt"),
    ],
)
def test_qualified_names_are_canonical(target: object, name: str) -> None:
    assert qualified_name(target) == name
    assert resolve_function(name) is target or name == "torch.arange"


@pytest.mark.parametrize("target", [torch._C._functorch._add_batch_dim, torch._C._log_api_usage_metadata])
def test_a_pybind11_function_is_named_by_its_own_name(target) -> None:
    """pybind11 3 starts a bound function's __qualname__ with its own record type; the
    name is the module's attribute, so such a call meets the allow-list by name."""
    name = qualified_name(target)
    assert name == f"{target.__module__}.{target.__name__}"
    with pytest.raises(DisallowedOp, match="not on the farm's allow-list"):
        resolve_function(name)


def test_unnamable_target() -> None:
    with pytest.raises(UnsupportedGraph, match="no importable qualified name") as refused:
        qualified_name(lambda x: x)
    assert "test_unnamable_target.<locals>.<lambda>" in str(refused.value)
    assert " at 0x" not in str(refused.value), "an address makes each process's refusal differ"


def test_the_version_step_of_a_data_assignment_is_refused_with_what_it_is() -> None:
    # `module.to(dtype)` in forward assigns each parameter's `.data`: Dynamo records a
    # `set_` and a function of its own beside it, whose refusal read "<locals> has no
    # importable qualified name".
    helpers = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        helpers.extend(n.target for n in gm.graph.nodes if "<locals>" in getattr(n.target, "__qualname__", ""))
        return gm.forward

    class Recast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.proj = self.proj.to(torch.float32)
            return self.proj(x)

    torch._dynamo.reset()
    torch.compile(Recast(), backend=backend)(torch.randn(2, 4))
    torch._dynamo.reset()
    if not helpers:
        pytest.skip("this torch's Dynamo breaks the graph at the assignment instead")
    for helper in helpers:
        with pytest.raises(UnsupportedGraph, match=r"the version counter step of `\.data =`"):
            qualified_name(helper)


# One or more members of each class of call that must never run on a server.
DENIED_BY_CLASS = {
    "serialization": [
        "torch.save", "torch.load", "torch.serialization.save", "torch.jit.load",
        "torch.jit.save", "torch.package.PackageImporter",
    ],
    "file I/O": ["torch.from_file", "torch.ops.aten.from_file.default", "builtins.open"],
    "network I/O": ["torch.hub.load", "torch.hub.download_url_to_file", "socket.socket"],
    "loading libraries": [
        "torch.ops.load_library", "torch._ops.ops.load_library", "torch.classes.load_library",
        "torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline",
        "ctypes.CDLL",
    ],
    "process and environment": [
        "os.system", "os.environ.get", "subprocess.run", "sys.exit", "os.getenv",
        "torch.multiprocessing.spawn",
    ],
    "global-state setters": [
        "torch._C._set_default_dtype", "torch._C._set_print_stack_traces_on_fatal_signal",
        "torch.set_default_dtype", "torch.set_num_threads", "torch.set_printoptions",
        "torch.set_rng_state", "torch.set_default_device", "torch._C._set_deterministic_algorithms",
    ],
    "RNG seeds": [
        "torch.manual_seed", "torch.seed", "torch.random.manual_seed", "torch.cuda.manual_seed",
        "torch._C._set_rng_state",
    ],
    "printing": ["torch.ops.aten._print.default", "builtins.print"],
    "profilers": [
        "torch.profiler.profile", "torch.autograd.profiler.profile",
        "torch.ops.profiler._record_function_enter_new.default",
        "torch.autograd.profiler.record_function",
    ],
}


@pytest.mark.parametrize(
    "name", [n for names in DENIED_BY_CLASS.values() for n in names]
)
def test_each_denied_class_is_refused(name: str) -> None:
    assert not is_allowed_function(name)
    with pytest.raises(DisallowedOp):
        resolve_function(name)


def test_no_enumerated_name_passes_the_deny_prefixes() -> None:
    gen = _generator()
    # DTensor.from_local is under torch.distributed: reviewed in torchfarm/graph/dtensor.py,
    # whose mesh and placement checks the validator applies to every call.
    reviewed = set(gen.HELPERS) | set(dtensor.allowed_functions())
    leaked = [
        name
        for name in load_allowlist().functions
        if name.startswith(tuple(denylist.DENIED_PREFIXES)) and name not in reviewed
    ]
    assert leaked == []


@pytest.mark.parametrize("name", ["T", "shape", "dtype", "ndim", "mT"])
def test_allowed_attributes(name: str) -> None:
    assert is_allowed_attribute(name)


@pytest.mark.parametrize(
    "name", ["grad_fn", "data", "grad", "__class__", "__dict__", "storage", "view", "_base"]
)
def test_denied_attributes(name: str) -> None:
    assert not is_allowed_attribute(name)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_parameter_read_through_data_trains_on_the_farm(compiling_farm) -> None:
    # `w.data` in the compiled code (Gemma 3n) is `torch._C._autograd._get_data_attr`,
    # which was not on the list: the whole graph compiled locally.
    from sdk.backend import FarmBackend

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x * w.data).sin() * w

    backend = FarmBackend(compiling_farm.sdk_settings(fallback="error"), client=compiling_farm.client())
    x, w = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    out = torch.compile(f, backend=backend)(x, w)
    out.sum().backward()
    x_ref, w_ref = x.detach().requires_grad_(), w.detach().requires_grad_()
    f(x_ref, w_ref).sum().backward()
    torch.testing.assert_close(out, f(x_ref, w_ref))
    torch.testing.assert_close((x.grad, w.grad), (x_ref.grad, w_ref.grad))
