"""The images install what their process imports: pyproject's extras against the code.

Each process's imports are followed from its entry point through the project's own
modules (imports inside functions too, since they run); every third-party module they
reach must come from the core dependencies or that process's extra, and each Dockerfile
must install that extra. The coordinator image once lacked `cryptography`
(torchfarm/trust/signing.py) because its Dockerfile listed packages by hand.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

from scripts.extra_requirements import requirements
from tests.ops.promql import ROOT

PROJECT = {"sdk", "services", "workers", "torchfarm", "cli", "localfarm", "examples"}
DISTRIBUTION = {
    "grpc": "grpcio", "grpc_health": "grpcio-health-checking", "google": "protobuf",
    "redis": "redis", "celery": "celery", "kombu": "celery", "prometheus_client": "prometheus-client",
    "cryptography": "cryptography", "torch": "torch", "triton": "triton", "numpy": "numpy",
}
"""Import name → the distribution that provides it."""
FROM_TORCH = {"numpy", "triton"}
"""Modules a GPU worker gets with its torch wheel (CUDA: triton; ROCm: pytorch-triton-rocm),
imported only when present (numpy) or for GPU targets."""
TORCH_REQUIRES = {"sympy", "networkx", "jinja2", "filelock", "fsspec", "typing_extensions"}
"""torch's own dependencies: there wherever torch is."""

ENTRY = {
    "coordinator": ["services.coordinator.server", "torchfarm.trust.provision"],
    "worker": ["workers.app", "workers.tasks"],
    # `torchfarm status`, `cache` and `warm`; `torchfarm up` needs the `all` extra.
    "sdk": ["sdk", "sdk.api", "sdk.backend", "cli.cache", "cli.warm", "cli.targets"],
}
DOCKERFILES = {
    "coordinator.Dockerfile": "coordinator",
    "worker-cpu.Dockerfile": "worker",
    "worker-cuda.Dockerfile": "worker",
    "worker-rocm.Dockerfile": "worker",
}


def _requirements(extra: str) -> set[str]:
    """The distribution names the extra installs, its own extras expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[\[=<>!~; ]", req, maxsplit=1)[0].lower() for req in requirements(project, [extra])}


def _module_file(name: str) -> Path | None:
    base = ROOT / name.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` but those under `if TYPE_CHECKING:`, which never run."""
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    return [node for node in ast.walk(tree) if id(node) not in skipped]


def third_party_imports(entries: list[str]) -> dict[str, str]:
    """Top-level third-party module → the project module that imports it first."""
    seen, todo, found = set(), list(entries), {}
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if name in seen or path is None:
            continue
        seen.add(name)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    mod = f"{base}.{node.module}" if node.module else base
                else:
                    mod = node.module or ""
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                top = target.split(".")[0]
                if top in PROJECT:
                    todo.append(target)
                elif top and top not in sys.stdlib_module_names and top != "__future__":
                    found.setdefault(top, name)
    return found


@pytest.mark.parametrize("extra", sorted(ENTRY))
def test_each_process_imports_only_what_its_extra_installs(extra):
    installs = _requirements(extra)
    missing = {
        mod: where for mod, where in third_party_imports(ENTRY[extra]).items()
        if DISTRIBUTION.get(mod, mod) not in installs
        and not (extra == "worker" and mod in FROM_TORCH)
        and not ("torch" in installs and mod in TORCH_REQUIRES)
    }
    assert not missing, f"[{extra}] lacks the distributions of {missing} (module → first importer)"


def test_the_scan_finds_the_coordinators_signing_dependency():
    """What the first coordinator image lacked: cryptography, through torchfarm/trust/signing.py."""
    found = third_party_imports(ENTRY["coordinator"])
    assert found.get("cryptography") is not None and "torch" not in found


def test_the_coordinator_extra_has_no_torch():
    assert "torch" not in _requirements("coordinator")


def _extras(text: str, pattern: str) -> list[set[str]]:
    """The extras each match of `pattern` names, ${EXTRAS} read from its ARG."""
    default = re.search(r"^ARG EXTRAS=(\S+)", text, re.M)
    return [set(group.replace("${EXTRAS}", default.group(1) if default else "").split(","))
            for group in re.findall(pattern, text)]


@pytest.mark.parametrize("dockerfile,extra", sorted(DOCKERFILES.items()))
def test_each_image_installs_its_extra_in_a_build_stage(dockerfile, extra):
    """The build stage installs the extra's dependencies from pyproject.toml (before the
    source, so the big layer is cached), the final stage the project's wheel with that
    extra and no index: a dependency the venv lacks fails the build."""
    text = (ROOT / "docker" / dockerfile).read_text()
    assert re.search(r"^FROM \S+ AS build$", text, re.M) and re.search(r"^FROM \S+ AS wheel$", text, re.M)
    deps = _extras(text, r'python extra_requirements\.py "?([\w,${}]+)"? > /tmp/requirements\.txt')
    final = _extras(text, r'pip install --no-index --find-links /tmp/wheels "torchfarm\[([^\]]+)\]"')
    assert len(deps) == 1 and len(final) == 1 and extra in deps[0] and deps == final, (deps, final)
    assert not re.search(r"pip install [^\n]*--no-deps", text), "dependencies come from the extra, never by hand"
    assert text.index("COPY pyproject.toml constraints.txt scripts/extra_requirements.py") < text.index(
        "AS wheel"), "the dependencies are installed before any source is copied"
    assert re.search(r"^HEALTHCHECK ", text, re.M)


def test_extra_requirements_expands_the_projects_own_extras():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client = requirements(project, ["client"])
    assert client == project["dependencies"] + project["optional-dependencies"]["sdk"]
    assert not any(r.startswith("torchfarm") for r in requirements(project, ["all"]))
    assert "triton==3.7.*" in requirements(project, ["worker", "kernels"])
    with pytest.raises(SystemExit, match="no extra 'gpu'"):
        requirements(project, ["gpu"])


@pytest.mark.parametrize("dockerfile", ["worker-cuda.Dockerfile", "worker-rocm.Dockerfile"])
def test_gpu_workers_keep_the_triton_their_torch_ships(dockerfile):
    text = (ROOT / "docker" / dockerfile).read_text()
    assert all("kernels" not in extras for extras in _extras(text, r'"torchfarm\[([^\]]+)\]"'))
    assert re.search(r"grep -v -E '\^\(torch\|triton", text), "constraints' triton pin is dropped"


@pytest.mark.parametrize("dockerfile", ["worker-cpu.Dockerfile", "worker-cuda.Dockerfile",
                                        "worker-rocm.Dockerfile"])
def test_kernel_caches_are_outside_tmp(dockerfile):
    """Compose mounts /tmp as a tmpfs, noexec by default; kernels are dlopen'ed from these."""
    env = dict(re.findall(r"(TORCHINDUCTOR_CACHE_DIR|TRITON_CACHE_DIR|TMPDIR)=(\S+)",
                          (ROOT / "docker" / dockerfile).read_text()))
    assert set(env) >= {"TORCHINDUCTOR_CACHE_DIR", "TMPDIR"}
    assert not any(v.startswith("/tmp") for v in env.values()), env


@pytest.mark.parametrize("dockerfile", sorted(d for d, extra in DOCKERFILES.items() if extra == "worker"))
def test_each_worker_image_installs_the_packages_whose_ops_it_serves_by_default(dockerfile):
    """Issue 43: the reviewed custom-op modules a worker loads with no setting
    (DEFAULT_INSTALLED_OP_MODULES) load only where their package is installed, so each
    worker image installs it: transformers' MoE op compiles on the farm out of the box."""
    from torchfarm.graph.customops import DEFAULT_INSTALLED_OP_MODULES

    text = (ROOT / "docker" / dockerfile).read_text()
    (extras,) = _extras(text, r'pip install --no-index --find-links /tmp/wheels "torchfarm\[([^\]]+)\]"')
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installs = {re.split(r"[\[=<>!~; ]", r, maxsplit=1)[0].lower() for r in requirements(project, sorted(extras))}
    for entry in DEFAULT_INSTALLED_OP_MODULES:
        package = entry.partition("=")[2].partition(".")[0]
        assert package in installs, f"{dockerfile} lacks {package}, whose ops workers load by default"
