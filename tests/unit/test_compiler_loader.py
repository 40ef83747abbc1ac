"""Worker compile → shipped kernels → client load with no local C++ build.

Three groups:
- torch internals that `sdk/loader.py` and `workers/compiler.py` hook, pinned for torch
  2.13.0: these fail loudly, with the reason, when an upgrade moves them;
- `torchfarm.fx.fingerprint` fingerprints;
- end to end (slow): the test process is the worker; each client is a fresh process with
  an empty TORCHINDUCTOR_CACHE_DIR and an empty TMPDIR (so no precompiled header or ISA
  probe from this machine either), first from this venv, then from a second venv at
  another path, where every kernel key differs from the worker's.

Tolerances against eager: loss and every gradient with rtol=1e-5, atol=1e-6
(`torch.testing.assert_close`). Measured differences are ~1e-9: Inductor reorders float
reductions, so bit equality is not expected.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from examples.models import TINY_GPT, make_gpt, make_mlp
from sdk.errors import ArtifactRejected
from sdk.loader import install_kernels
from tests.second_venv import VenvUnavailable, second_venv
from torchfarm.fx import internals
from torchfarm.fx.cpp_kernels import SPEC_ARGS, KernelSpec, load_fn_outputs, local_outputs, spec_args
from torchfarm.fx.fingerprint import Fingerprint, local_fingerprint
from torchfarm.fx.hooks import count_kernel_builds
from torchfarm.fx.vecisa import probed_toolchain
from workers.compiler import CompileFailed, CompileResult, compile_graph, inductor_config_patch

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
RTOL, ATOL = 1e-5, 1e-6
TINY_SOURCE = 'extern "C" int torchfarm_probe() { return 42; }\n'


# ---- torch internals (torch 2.13.0) -------------------------------------------------


@pytest.fixture
def fresh_inductor(tmp_path):
    """An empty Inductor cache dir and cleared in-memory code caches for this test."""
    from torch._inductor.utils import fresh_cache

    with fresh_cache(dir=str(tmp_path)):
        yield Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def test_load_async_signature_is_what_specs_record():
    from torch._inductor.codecache import CppCodeCache

    # 2.12's has no needs_vec_isa and kernel_needs_vec_isa (torchfarm/fx/internals.py's SEAM).
    where = internals.internal("CppCodeCache.load_async")
    assert where is not None
    params = list(inspect.signature(CppCodeCache.load_async).parameters)
    assert params == list(where.params), (
        "CppCodeCache.load_async changed: update torchfarm.fx.cpp_kernels.SPEC_ARGS and the spec format"
    )
    assert set(where.params) - {"submit_fn"} <= set(SPEC_ARGS)


def test_every_cpp_code_cache_inherits_load_async():
    # record_kernel_loads patches CppCodeCache.load_async once for all of them.
    from torch._inductor import codecache

    for name in ("CppPythonBindingsCodeCache", "CppWrapperCodeCache"):
        cls = getattr(codecache, name)
        assert issubclass(cls, codecache.CppCodeCache)
        assert "load_async" not in cls.__dict__, f"{name} overrides load_async"


def test_load_async_without_submit_fn_keys_but_builds_nothing(fresh_inductor):
    from torch._inductor import codecache
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    pick_vec_isa()  # its once-per-process ISA probe may build; not what this pins
    with count_kernel_builds() as builds:
        load_fn = codecache.CppCodeCache.load_async(TINY_SOURCE)
    assert builds.count == 0
    # load_fn is cached under the key, and closes over worker_fn =
    # partial(_worker_compile_cpp, lock_path, builders) and binary_path.
    cells = dict(zip(load_fn.__code__.co_freevars, load_fn.__closure__, strict=True))
    worker_fn = cells["worker_fn"].cell_contents
    assert worker_fn.func is codecache._worker_compile_cpp
    key, targets = load_fn_outputs(codecache.CppCodeCache, load_fn)
    assert codecache.CppCodeCache.cache[key] is load_fn
    assert targets[-1] == cells["binary_path"].cell_contents
    assert targets[-1].startswith(str(fresh_inductor)) and key in targets[-1]


def test_worker_compile_cpp_skips_builders_whose_target_exists(fresh_inductor):
    from torch._inductor import codecache
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    pick_vec_isa()  # its once-per-process ISA probe builds too, when this test runs first
    with count_kernel_builds() as first:
        lib = codecache.CppCodeCache.load(TINY_SOURCE)
    assert lib.torchfarm_probe() == 42
    assert len(first.kernels) == 1
    codecache.CppCodeCache.cache_clear()  # as a new process would: only the disk is warm
    with count_kernel_builds() as second:
        codecache.CppCodeCache.load(TINY_SOURCE)
    assert second.count == 0


def test_kernel_key_holds_the_torch_install_path():
    # The reason kernels are re-keyed on the client. If this fails, torch made the
    # command line relocatable and install_kernels' remapping may be unnecessary.
    from torch._inductor.cpp_builder import CppBuilder, CppTorchDeviceOptions

    options = CppTorchDeviceOptions(device_type="cpu")
    cmd = CppBuilder(name="o", sources="i", BuildOption=options).get_command_line()
    assert os.path.dirname(torch.__file__) in cmd


def test_precompiled_headers_are_in_the_key_so_we_stub_the_build_instead():
    from torch._inductor import codecache, config
    from torch._inductor.cpp_builder import CppBuilder, CppTorchDeviceOptions

    def cmd() -> str:
        options = CppTorchDeviceOptions(device_type="cpu")
        return CppBuilder(name="o", sources="i", BuildOption=options).get_command_line()

    with config.patch(cpp_cache_precompile_headers=True):
        on = cmd()
    with config.patch(cpp_cache_precompile_headers=False):
        off = cmd()
    assert callable(codecache._precompile_header)
    assert "_precompile_header" in codecache.CppCodeCache.load_async.__func__.__code__.co_names
    if internals.torch_minor() >= (2, 12):  # 2.11's command line leaves the header out either way
        assert on != off, "precompile-header config left the key: sdk.loader could toggle it instead"


def test_isa_probe_is_cached_and_configurable():
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    assert hasattr(valid_vec_isa_list, "cache_clear")
    assert hasattr(config.cpp, "vec_isa_ok")


def test_standalone_compile_and_artifact_api():
    from torch._inductor.standalone_compile import AOTCompiledArtifact

    params = inspect.signature(torch._inductor.standalone_compile).parameters
    for name in ("dynamic_shapes", "options", "aot"):
        assert name in params
    # 2.12 takes no fake_mode; internals.standalone_compile patches it in there.
    assert ("fake_mode" in params) == ("fake_mode" in internals.internal("standalone_compile").params)
    assert callable(AOTCompiledArtifact.deserialize) and callable(AOTCompiledArtifact.serialize)


def test_mode_and_options_map_like_torch_compile():
    patch = inductor_config_patch("max-autotune-no-cudagraphs", {"epilogue_fusion": False}, False)
    assert patch == {"max_autotune": True, "coordinate_descent_tuning": True, "epilogue_fusion": False}
    assert inductor_config_patch("", None, False) == {}
    assert inductor_config_patch("default", None, True) == {}


def test_bad_option_is_a_compile_failure():
    model, (x,) = make_mlp(batch=2)
    with pytest.raises(CompileFailed, match="no_such_option"):
        compile_graph(torch.fx.symbolic_trace(model), [x], inductor_options={"no_such_option": 1})


# ---- install_kernels ---------------------------------------------------------------


def _tiny_spec() -> KernelSpec:
    args = spec_args({"main_code": TINY_SOURCE, "device_type": "cpu", "extra_flags": ()})
    return KernelSpec("CppCodeCache", args, output=0, outputs=1)


def test_install_writes_where_inductor_looks_and_is_idempotent(fresh_inductor):
    from torch._inductor import codecache

    spec = _tiny_spec()
    assert KernelSpec.from_bytes(spec.to_bytes()) == spec
    assert install_kernels([(spec.to_bytes(), b"first")]) == 1
    assert install_kernels([(spec.to_bytes(), b"first")]) == 0
    assert install_kernels([(spec.to_bytes(), b"second")]) == 1
    key, targets = load_fn_outputs(
        codecache.CppCodeCache, codecache.CppCodeCache.load_async(TINY_SOURCE)
    )
    assert Path(targets[-1]).read_bytes() == b"second"
    assert (key, targets) == local_outputs(spec)


@pytest.mark.parametrize(
    "source",
    [
        b"not json",
        b'{"format": "other"}',
        _tiny_spec().to_bytes().replace(b"CppCodeCache", b"os.system"),
        _tiny_spec().to_bytes().replace(b'"device_type":"cpu"', b'"device_type":1'),
        _tiny_spec().to_bytes().replace(b'"output":0', b'"output":1'),
    ],
)
def test_install_rejects_malformed_specs(fresh_inductor, source):
    with pytest.raises(ArtifactRejected):
        install_kernels([(source, b"x")])


# ---- fingerprint -------------------------------------------------------------------


def test_fingerprint_fields_and_round_trip():
    fp = local_fingerprint()
    assert Fingerprint.from_dict(fp.to_dict()) == fp
    assert fp.python == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert fp.platform.startswith(sys.platform + "-")
    assert (fp.device, fp.arch) == ("cpu", "")
    assert fp.isa == torch.backends.cpu.get_cpu_capability().lower()
    assert fp.torch_version == torch.__version__ and fp.torch_git == torch.version.git_version
    assert "-march=" in fp.compiler and fp.compiler.split(";")[0].strip()
    with pytest.raises(ValueError):
        Fingerprint.from_dict({**fp.to_dict(), "extra": "x"})
    with pytest.raises(ValueError):
        Fingerprint.from_dict({k: v for k, v in fp.to_dict().items() if k != "isa"})


@pytest.mark.slow
def test_fingerprint_isa_follows_aten_cpu_capability():
    local = local_fingerprint()
    # avx2 on an AVX-512 machine (the case torch-facts.md measured); elsewhere the
    # portable "default", which every x86 CPU accepts.
    wanted = "avx2" if local.isa == "avx512" else "default"
    code = "import json; from torchfarm.fx.fingerprint import local_fingerprint as f; print(json.dumps(f().to_dict()))"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "ATEN_CPU_CAPABILITY": wanted, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    other = Fingerprint.from_dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert other.isa == wanted
    assert other != local


# ---- end to end --------------------------------------------------------------------


def _capture(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """The Dynamo graph, example inputs and fake mode, as a worker's decoder would give."""
    from torch._guards import TracingContext

    captured: dict[str, Any] = {}

    def backend(gm, example_inputs):
        captured.update(gm=gm, inputs=example_inputs, fake_mode=TracingContext.get().fake_mode)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(*inputs)
    torch._dynamo.reset()
    return captured


def _compile(captured: dict[str, Any]) -> CompileResult:
    return compile_graph(captured["gm"], captured["inputs"], fake_mode=captured["fake_mode"])


MODELS = {
    "mlp": lambda: make_mlp(batch=8),
    "tiny_gpt": lambda: make_gpt(TINY_GPT, batch=2),
}


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """This process as a worker: cold compiles of both models, then the MLP again with a
    warm cache, in process and (after dropping in-memory caches) from disk only."""
    from torch._inductor.utils import clear_caches, fresh_cache

    out: dict[str, Any] = {}
    with fresh_cache(dir=str(tmp_path_factory.mktemp("worker-inductor"))):
        config_before = torch._inductor.config.get_config_copy()
        for name, make in MODELS.items():
            model, inputs = make()
            out[name] = _compile(_capture(model, inputs))
        out["config_unchanged"] = torch._inductor.config.get_config_copy() == config_before
        captured = _capture(*MODELS["mlp"]())
        out["mlp_warm_process"] = _compile(captured)
        clear_caches()
        out["mlp_warm_disk"] = _compile(captured)
        out["toolchain"] = probed_toolchain()  # what a manifest carries to the client
        out["worker_keys"] = {
            name: sorted(local_outputs(KernelSpec.from_bytes(k.source))[0] for k in out[name].kernels)
            for name in MODELS
        }
    return out


@pytest.mark.slow
def test_worker_result_shape(worker):
    for name in MODELS:
        result: CompileResult = worker[name]
        assert result.payload and result.kernels
        assert {k.kind for k in result.kernels} == {"cpp"}
        assert len({k.name for k in result.kernels}) == len(result.kernels)
        assert all(k.binary[:4] == b"\x7fELF" for k in result.kernels)
        assert all(KernelSpec.from_bytes(k.source).args["main_code"] for k in result.kernels)
        # The phase split reads dynamo_timed's "create_aot_dispatcher_function" and
        # "compile_fx_inner": missing phases on a cold compile mean they were renamed.
        assert {"compile", "collect", "decompose", "lower", "kernels"} <= set(result.timings)
        assert result.stats["kernels"] == len(result.kernels)
        assert result.stats["local_builds"] >= len(result.kernels)
    assert worker["config_unchanged"], "compile_graph left Inductor's global config changed"


@pytest.mark.slow
def test_warm_worker_cache_ships_the_same_kernels(worker):
    cold: CompileResult = worker["mlp"]
    for warm in (worker["mlp_warm_process"], worker["mlp_warm_disk"]):
        assert warm.stats["local_builds"] == 0
        assert [(k.name, k.binary) for k in warm.kernels] == [(k.name, k.binary) for k in cold.kernels]


@pytest.mark.slow
def test_compiler_error_carries_the_compilers_message(fresh_inductor):
    captured = _capture(*make_mlp(batch=4))
    with pytest.raises(CompileFailed) as info:
        compile_graph(
            captured["gm"], captured["inputs"], fake_mode=captured["fake_mode"],
            inductor_options={"cpp.march": "no-such-cpu"},
        )
    assert "CppCompileError" in str(info.value)
    assert "-march=no-such-cpu" in str(info.value)  # the failing g++ command line


@pytest.mark.slow
def test_dynamic_batch_from_a_dynamo_graph(fresh_inductor):
    from sdk.loader import load_compiled

    model, (x,) = make_mlp(batch=8)
    from torch._guards import TracingContext

    captured: dict[str, Any] = {}

    def backend(gm, example_inputs):
        captured.update(gm=gm, inputs=example_inputs, fake_mode=TracingContext.get().fake_mode)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend, dynamic=True)(x)
    result = compile_graph(captured["gm"], captured["inputs"], fake_mode=captured["fake_mode"], dynamic=True)
    torch._dynamo.reset()
    compiled = load_compiled(result.payload)
    twin = copy.deepcopy(model)
    run = torch.compile(twin, backend=lambda gm, ex: compiled, dynamic=True)
    for batch in (8, 5, 3):
        xb = torch.randn(batch, 64)
        for m in (model, twin):
            m.zero_grad()
        out = run(xb)
        out.pow(2).mean().backward()
        ref = model(xb)
        ref.pow(2).mean().backward()
        torch.testing.assert_close(out, ref, rtol=RTOL, atol=ATOL)
        for p, q in zip(twin.parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL)
    torch._dynamo.reset()


CLIENT = r"""
import copy, json, sys, time
import torch
from examples.models import TINY_GPT, make_gpt, make_mlp
from sdk.loader import install_kernels, load_compiled
from torchfarm.fx.hooks import count_kernel_builds
from torchfarm.fx.cpp_kernels import KernelSpec, local_outputs

bundle, rtol, atol = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
makers = {"mlp": lambda: make_mlp(batch=8), "tiny_gpt": lambda: make_gpt(TINY_GPT, batch=2)}
report = {}
for name, make in makers.items():
    with open(f"{bundle}/{name}.json") as f:
        files = json.load(f)
    kernels = [(open(s, "rb").read(), open(b, "rb").read()) for s, b in files["kernels"]]
    with count_kernel_builds() as builds:
        installed = install_kernels(kernels, files["toolchain"])
        compiled = load_compiled(open(files["payload"], "rb").read())
        model, inputs = make()
        ref = copy.deepcopy(model)
        torch._dynamo.reset()
        out = torch.compile(model, backend=lambda gm, ex: compiled)(*inputs)
        loss = out if out.dim() == 0 else out.pow(2).mean()
        loss.backward()
    expected = ref(*inputs)
    expected = expected if expected.dim() == 0 else expected.pow(2).mean()
    expected.backward()
    errors = []
    for (pname, p), q in zip(model.named_parameters(), ref.parameters()):
        try:
            torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol)
        except AssertionError as e:
            errors.append(f"grad {pname}: {e}")
    try:
        torch.testing.assert_close(loss, expected, rtol=rtol, atol=atol)
    except AssertionError as e:
        errors.append(f"loss: {e}")
    report[name] = {
        "installed": installed,
        "builds": [t for t, _, _ in builds.runs],
        "keys": sorted(local_outputs(KernelSpec.from_bytes(s))[0] for s, _ in kernels),
        "loss": loss.item(),
        "expected": expected.item(),
        "errors": errors,
    }
print("REPORT " + json.dumps(report))
"""


def _write_bundle(directory: Path, worker: dict[str, Any]) -> Path:
    for name in MODELS:
        result: CompileResult = worker[name]
        files: dict[str, Any] = {"payload": str(directory / f"{name}.payload"), "kernels": []}
        Path(files["payload"]).write_bytes(result.payload)
        for i, k in enumerate(result.kernels):
            src, binary = directory / f"{name}.{i}.src", directory / f"{name}.{i}.bin"
            src.write_bytes(k.source)
            binary.write_bytes(k.binary)
            files["kernels"].append([str(src), str(binary)])
        files["toolchain"] = worker["toolchain"]
        (directory / f"{name}.json").write_text(json.dumps(files))
    return directory


def _run_client(python: Path | str, tmp_path: Path, worker: dict[str, Any]) -> dict[str, Any]:
    bundle = _write_bundle(tmp_path, worker)
    (tmp_path / "cache").mkdir()
    (tmp_path / "tmp").mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
        "TMPDIR": str(tmp_path / "tmp"),
    }
    proc = subprocess.run(
        [str(python), "-c", CLIENT, str(bundle), str(RTOL), str(ATOL)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT "))
    report = json.loads(line[len("REPORT "):])
    for name in MODELS:
        r = report[name]
        assert r["installed"] == len(worker[name].kernels), name
        assert r["builds"] == [], f"{name}: the client ran the C++ compiler: {r['builds']}"
        assert r["errors"] == [], f"{name} differs from eager: {r['errors']}"
    return report


@pytest.mark.slow
def test_fresh_client_process_loads_without_building(worker, tmp_path):
    report = _run_client(sys.executable, tmp_path, worker)
    for name in MODELS:  # same install path: the local keys are the worker's
        assert report[name]["keys"] == worker["worker_keys"][name]


@pytest.mark.slow
def test_client_in_second_venv_loads_without_building(worker, tmp_path):
    try:
        python = second_venv()
    except VenvUnavailable as e:
        pytest.skip(f"cannot build a second virtualenv here: {e}")
    torch_dir = subprocess.run(
        [str(python), "-c", "import os, torch; print(os.path.dirname(torch.__file__))"],
        capture_output=True, text=True, timeout=300,
    ).stdout.strip()
    assert torch_dir and torch_dir != os.path.dirname(torch.__file__)
    report = _run_client(python, tmp_path, worker)
    for name in MODELS:  # another install path: every kernel key differs
        assert not set(report[name]["keys"]) & set(worker["worker_keys"][name])
