"""The public names, pinned (as httpx pins its own): every `__all__` in the project, and
each package's namespace, which holds nothing of the project beyond its `__all__`.

A name added to or dropped from a public surface fails here until it is pinned, so the
change is made on purpose. The `__all__` lists are read from the source (ast), so a new
one anywhere under the four trees is caught without importing its module first.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREES = ("sdk", "services", "torchfarm", "workers", "cli", "localfarm")

PINNED: dict[str, list[str]] = {
    "sdk": [
        "ArtifactRejected", "ConfigError", "FarmBug", "FarmError", "FarmUnavailable",
        "GraphRejected", "JobLost", "KernelRejected", "NoWorker", "QuotaExceeded",
        "RemoteCompileError", "RequestTooLarge", "Unauthenticated",
        "compile", "compile_kernel", "export", "farm_backend", "wait_ready", "warm",
    ],
    "torchfarm.wire.builds": [
        "FIELDS", "TRITON_DEVICES", "digest", "is_digest", "names_triton", "label", "of_request", "of_worker",
        "served_builds", "unrun_message", "unserved_message",
    ],
    "torchfarm.fx.internals": [
        "INTERNALS", "SEAM", "SUPPORTED", "VERIFIED", "Internal", "InternalMissing", "check",
        "internal", "load_async_args", "resolve", "standalone_compile", "torch_minor",
    ],
    "torchfarm.wire.routing": [
        "ASSEMBLE_TASK", "BUILD_KERNELS_TASK", "COMPILE_TASK", "DEVICES", "EXPORT", "EXPORT_TASK",
        "GRAPH", "KERNEL", "KERNEL_TASK", "LOWER_TASK", "UnknownDevice", "describe",
        "job_kind_of_queue", "queue_for", "queue_name", "served_targets", "stage_queue",
        "build_of_queue", "target_of", "target_of_queue", "unserved_message",
    ],
    "localfarm.fakes": [
        "InProcessClient", "InProcessFarm", "InProcessRpcError", "InlineDispatcher", "MemoryStore",
        "Task", "UnknownTask", "job_function", "memory_store", "worker_context",
    ],
    "localfarm.stack": [
        "INDUCTOR_SEED_ENV", "STOP_TIMEOUT_S", "LocalStack", "free_port", "redis_command",
        "seed_isa_probe", "start_redis_server", "wait_for_redis",
    ],
    "workers.sandbox": [
        "DEFAULT_HIDDEN", "HEADERS", "MODES", "RESULT_FILE", "STREAM", "Failure", "Forkserver", "Limits", "Sandbox",
        "SandboxExecutor", "SandboxFailed", "SandboxUnavailable", "SpecStream", "apply_limits", "build_kernels",
        "bwrap_argv", "bwrap_works", "check_ranks", "child_command", "child_env", "compile_triton", "compile_whole",
        "decompose", "export_package", "for_worker", "hidden_paths", "job_failure", "limits_for", "lower_graph",
        "python_to_bind_back", "resolve", "scratch_env",
    ],
}
"""Each module that declares `__all__` → its names, in the order it lists them."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _declared() -> dict[str, list[str]]:
    found = {}
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, ast.AnnAssign) else [])
                if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                    assert node.value is not None
                    found[_module_name(path)] = list(ast.literal_eval(node.value))
    return found


def _packages() -> list[str]:
    return sorted(_module_name(p) for tree in TREES for p in (ROOT / tree).rglob("__init__.py"))


def test_every_all_in_the_project_is_pinned():
    assert _declared() == PINNED


@pytest.mark.parametrize("module", sorted(PINNED))
def test_every_pinned_name_is_there_once(module):
    mod = importlib.import_module(module)
    assert len(set(mod.__all__)) == len(mod.__all__), module
    for name in mod.__all__:
        assert getattr(mod, name, None) is not None, f"{module}.{name}"


def _bound(init: Path) -> set[str]:
    """The public names an __init__ binds of its own or imports from the project."""
    names: set[str] = set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in TREES:
            names |= {a.asname or a.name for a in node.names}
    return {n for n in names if not n.startswith("_")}


@pytest.mark.parametrize("package", _packages())
def test_a_package_exports_only_its_all(package):
    """A package whose __init__ binds a public name of its own, or imports one from the
    project, declares it in `__all__`; one with no `__all__` binds none (a library's
    names it imports, such as `typing.Any`, are not its exports)."""
    init = ROOT / package.replace(".", "/") / "__init__.py"
    assert _bound(init) <= set(_declared().get(package, ())), package
