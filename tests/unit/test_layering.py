"""The layers of ARCHITECTURE.md, checked rather than hoped for.

    cli/  localfarm/                              top: may import anything
    sdk/    services/    workers/                 side by side, none importing another
    torchfarm/fx/                                 torch-side code the SDK and workers share
    torchfarm/ (the rest)                         the torch-free contract

Every import counts, including those inside functions.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torchfarm", "sdk", "services", "workers", "cli", "localfarm")

CONTRACT, FX, SDK, SERVICES, WORKERS, TOP = "contract", "fx", "sdk", "services", "workers", "top"
MAY_IMPORT = {
    CONTRACT: {CONTRACT},
    FX: {CONTRACT, FX},
    SDK: {CONTRACT, FX, SDK},
    SERVICES: {CONTRACT, SERVICES},
    WORKERS: {CONTRACT, FX, WORKERS},
    TOP: {CONTRACT, FX, SDK, SERVICES, WORKERS, TOP},
}


def layer_of(module: str) -> str:
    if module.split(".")[0] in ("cli", "localfarm"):
        return TOP
    if module.startswith("torchfarm.fx"):
        return FX
    if module.startswith("torchfarm"):
        return CONTRACT
    return module.split(".")[0]


@cache
def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _resolve(name: str) -> str | None:
    """The project module `name` refers to (a module, or a name defined in one)."""
    while name:
        if name in modules():
            return name
        name = name.rpartition(".")[0]
    return None


@cache
def imports_of(module: str) -> tuple[tuple[str, str], ...]:
    """(imported module, imported name or "") for every project import in `module`."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(m, "") for a in node.names if (m := _resolve(a.name))]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for a in node.names:
                target = _resolve(f"{base}.{a.name}")
                if target == f"{base}.{a.name}":
                    found.append((target, ""))
                elif (owner := _resolve(base)) is not None:
                    found.append((owner, a.name))
    return tuple(found)


def test_every_import_stays_in_its_layer():
    offenders = [
        f"{m} ({layer_of(m)}) imports {dep} ({layer_of(dep)})"
        for m in modules()
        for dep, _ in imports_of(m)
        if layer_of(dep) not in MAY_IMPORT[layer_of(m)]
    ]
    assert offenders == []


def test_no_module_imports_another_packages_private_name():
    def folder(module: str) -> str:
        return str(modules()[module].parent)

    offenders = [
        f"{m} imports {dep}.{name}"
        for m in modules()
        for dep, name in imports_of(m)
        if name.startswith("_") and not name.startswith("__") and folder(dep) != folder(m)
    ]
    assert offenders == []


def test_no_import_circle():
    graph = {m: {dep for dep, _ in imports_of(m) if dep != m} for m in modules()}
    # A package's __init__ that hands names on is not a circle with its own modules.
    for m in graph:
        graph[m] = {d for d in graph[m] if not m.startswith(d + ".")}
    circles = _strongly_connected(graph)
    assert circles == []


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm; the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _torch_loaded_after(code: str) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; {code}; print('torch' in sys.modules)"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    return out.stdout.strip() == "True"


def test_coordinator_does_not_import_torch():
    assert not _torch_loaded_after("import services.coordinator.server")


@pytest.mark.parametrize("layer", [CONTRACT, SERVICES])
def test_torch_free_layers_load_without_torch(layer):
    names = sorted(m for m in modules() if layer_of(m) == layer)
    assert not _torch_loaded_after("; ".join(f"import {m}" for m in names))


def test_the_checker_sees_a_violation(tmp_path):
    """The rules above can fail: a contract module importing the SDK is caught."""
    assert layer_of("torchfarm.wire.keys") == CONTRACT
    assert SDK not in MAY_IMPORT[CONTRACT]
    assert _strongly_connected({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
