"""No test assigns a private name of the project's code (issue 39, declared seams).

A test that replaces `module._name` or `obj._method` pins an implementation detail: the
code under it can be refactored into passing a broken path, or breaking a working one.
Tests go through public seams instead: a constructor argument, a public function, a
reset. Read from the source (ast), over every file under tests/:

- `monkeypatch.setattr(obj, "_name", ...)`, `monkeypatch.delattr(obj, "_name")`,
  `mock.patch.object(obj, "_name")` and `setattr(obj, "_name", ...)`, where `obj` is
  anything but a module outside the project (torch's own private names are torch's
  business) or the test's own `self`/`cls`;
- the string forms, `monkeypatch.setattr("workers.mod._name", ...)` and
  `mock.patch("workers.mod._name")`, naming a project module;
- a plain assignment `name._attr = ...` where `name` is imported from the project.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("sdk", "services", "workers", "torchfarm", "cli", "localfarm")
SETTERS = {"setattr", "delattr", "object"}  # monkeypatch.setattr/delattr, patch.object, setattr()
PATCHERS = {"setattr", "patch"}  # with a dotted string target


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _imports(tree: ast.Module) -> dict[str, str]:
    """Each name a file binds by import → the module it comes from."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                bound[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                bound[alias.asname or alias.name] = node.module
    return bound


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _of_project(module: str) -> bool:
    return module.split(".")[0] in PROJECT


def _outside(node: ast.expr, imports: dict[str, str]) -> bool:
    """The object is a module outside the project, one of its names, or the test's own."""
    root = _root(node)
    if not isinstance(root, ast.Name):
        return False
    if root.id in ("self", "cls"):
        return True
    return root.id in imports and not _of_project(imports[root.id])


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def private_patches(source: str) -> list[tuple[int, str]]:
    """(line, what) for each private project name `source` assigns."""
    tree = ast.parse(source)
    imports = _imports(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            name, first = _callee(node), node.args[0]
            if name in PATCHERS and isinstance(first, ast.Constant) and isinstance(first.value, str):
                parts = first.value.split(".")
                if _of_project(first.value) and any(_private(p) for p in parts[1:]):
                    found.append((node.lineno, first.value))
            elif name in SETTERS and len(node.args) >= 2:
                attr = node.args[1]
                if (isinstance(attr, ast.Constant) and isinstance(attr.value, str) and _private(attr.value)
                        and not _outside(first, imports)):
                    found.append((node.lineno, f"{ast.unparse(first)}.{attr.value}"))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    root = _root(t)
                    if (isinstance(t, ast.Attribute) and _private(t.attr) and isinstance(root, ast.Name)
                            and _of_project(imports.get(root.id, ""))):
                        found.append((node.lineno, ast.unparse(t)))
    return sorted(found)


def test_the_checker_finds_each_form():
    source = (
        "import torch\nfrom torchfarm import settings\nfrom localfarm.stack import LocalStack\n"
        "from unittest import mock\n"
        "def test(monkeypatch):\n"
        "    monkeypatch.setattr(settings, '_warned', set())\n"
        "    stack = LocalStack()\n"
        "    monkeypatch.setattr(stack, '_spawn', print)\n"
        "    monkeypatch.setattr('workers.hard_limits._store', print)\n"
        "    mock.patch.object(settings, '_warned')\n"
        "    settings._warned = set()\n"
        "    monkeypatch.setattr(torch.cuda, '_initialized', False)\n"  # torch's: not ours
        "    monkeypatch.setattr(settings, 'PREFIX', 'X')\n"  # public
        "    monkeypatch.setattr('torch.cuda._lazy_init', print)\n"
    )
    assert [line for line, _ in private_patches(source)] == [6, 8, 9, 10, 11]


def test_no_test_assigns_a_private_name_of_the_project():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for line, what in private_patches(path.read_text())
    ]
    assert found == [], "tests assign private names; give the code a public seam:\n" + "\n".join(found)
