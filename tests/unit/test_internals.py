"""Every torch internal the farm relies on exists in the installed torch, with the
parameters the code assumes (torchfarm/fx/internals.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from torchfarm.fx import internals


@pytest.mark.parametrize("name", sorted(internals.INTERNALS))
def test_each_internal_is_as_assumed(name):
    assert internals.check(name) is None


def test_the_running_torch_is_supported_and_has_a_seam():
    assert internals.torch_minor() in internals.SUPPORTED
    assert set(internals.SEAM) == set(internals.SUPPORTED)


def test_a_moved_internal_is_reported_by_name(monkeypatch):
    moved = internals.Internal("torch._inductor", "no_such_function", ("gm",))
    monkeypatch.setitem(internals.SEAM[internals.torch_minor()], "standalone_compile", moved)
    assert "torch._inductor.no_such_function" in internals.check("standalone_compile")
    with pytest.raises(internals.InternalMissing, match="standalone_compile"):
        internals.resolve("standalone_compile")


def test_a_changed_signature_is_reported(monkeypatch):
    changed = internals.Internal("torch._inductor", "standalone_compile", ("model", "inputs"))
    monkeypatch.setitem(internals.SEAM[internals.torch_minor()], "standalone_compile", changed)
    assert "the farm assumes ['model', 'inputs']" in internals.check("standalone_compile")


def test_an_unsupported_torch_is_refused_by_version():
    with pytest.raises(internals.InternalMissing, match="torch 2.10 is not supported"):
        internals.internal("standalone_compile", (2, 10))
    assert internals.torch_minor("2.12.1+cu128") == (2, 12)


def test_resolve_gives_the_object_itself():
    assert internals.resolve("standalone_compile") is torch._inductor.standalone_compile


# Every use of a torch internal goes through torchfarm/fx/internals.py, so that a torch
# version that moves one is handled in one place (its SEAM) rather than at call sites.
_PACKAGES = ("sdk", "workers", "services", "torchfarm")
_SEAM_MODULE = Path("torchfarm/fx/internals.py")


def _private(dotted: str) -> bool:
    """torch._inductor, torch.utils._sympy, torch._C: a name under torch with a private part."""
    parts = dotted.split(".")
    return parts[0] == "torch" and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _dotted(node.test).endswith("TYPE_CHECKING"):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def direct_uses(root: Path) -> list[str]:
    """`path:line: name` of each torch internal imported or reached outside the seam
    module (imports for type checking only excepted: they never run)."""
    found: dict[tuple[str, int], str] = {}
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if rel == _SEAM_MODULE or "v1" in rel.parts:
                continue
            tree = ast.parse(path.read_text())
            typing_only = _type_checking_lines(tree)
            for node in ast.walk(tree):
                names: list[str] = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.Attribute):
                    names = [_dotted(node)]
                elif isinstance(node, ast.Call) and _dotted(node.func).endswith("import_module") and node.args:
                    arg = node.args[0]
                    names = [arg.value] if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else []
                private = [n for n in names if _private(n)]
                line = getattr(node, "lineno", 0)
                if private and line not in typing_only:
                    where = (str(rel), line)
                    found[where] = min([*private, found.get(where, private[0])], key=len)
    return sorted(f"{path}:{line}: {name}" for (path, line), name in found.items())


def test_no_module_but_the_seam_uses_torch_internals():
    assert direct_uses(Path(__file__).resolve().parents[2]) == []


def test_the_scan_finds_each_kind_of_direct_use(tmp_path):
    (tmp_path / "sdk").mkdir()
    (tmp_path / "sdk" / "bad.py").write_text(
        "import importlib\nfrom typing import TYPE_CHECKING\nimport torch\n"
        "from torch._inductor import config\n"
        "if TYPE_CHECKING:\n    from torch._subclasses.fake_tensor import FakeTensor\n"
        "def f():\n    torch._dynamo.reset()\n"
        "    importlib.import_module('torch._inductor.codecache')\n"
        "    return torch.__version__, torch.utils._pytree\n"
    )
    assert direct_uses(tmp_path) == [
        "sdk/bad.py:10: torch.utils._pytree",
        "sdk/bad.py:4: torch._inductor",
        "sdk/bad.py:8: torch._dynamo",
        "sdk/bad.py:9: torch._inductor.codecache",
    ]


def _as_before(monkeypatch, version):
    """Makes the running torch's seam row that of `version`, for the names that matter
    to `internals.standalone_compile`."""
    row = internals.SEAM[version]
    for name in ("standalone_compile", "resolve_fake_mode"):
        monkeypatch.setitem(internals.SEAM[internals.torch_minor()], name, row.get(name, internals.INTERNALS[name]))


@pytest.mark.parametrize("version", [(2, 12), (2, 11)])
def test_standalone_compile_gets_the_given_fake_mode_and_an_eager_backward_before_2_13(monkeypatch, version):
    # Without fake_mode (2.11, 2.12), standalone_compile makes a FakeTensorMode of its own:
    # 2.12 in _resolve_fake_mode, 2.11 inline. The seam must hand it ours, and force the
    # backward's lowering, as 2.13 does; both are read here from inside the call.
    module = internals.resolve("standalone_compile_module")
    if version == (2, 12) and not hasattr(module, "_resolve_fake_mode"):
        pytest.skip("this torch (2.11) has no _resolve_fake_mode to stand in for 2.12's")
    seen = {}

    def fake_compile(gm, example_inputs, *, dynamic_shapes, options, aot):
        if version == (2, 12):
            seen["mode"] = module._resolve_fake_mode(gm, dynamic_shapes)
        else:
            seen["mode"] = module.FakeTensorMode(shape_env=None)
        seen["eager_backward"] = torch._functorch.config.force_non_lazy_backward_lowering
        return "artifact"

    _as_before(monkeypatch, version)
    monkeypatch.setattr(torch._inductor, "standalone_compile", fake_compile)
    ours = object()
    real_resolve, real_class = getattr(module, "_resolve_fake_mode", None), module.FakeTensorMode
    got = internals.standalone_compile(
        None, [], dynamic_shapes="from_example_inputs", options={}, aot=True, fake_mode=ours
    )
    assert got == "artifact" and seen == {"mode": ours, "eager_backward": True}
    assert (getattr(module, "_resolve_fake_mode", None), module.FakeTensorMode) == (real_resolve, real_class)
    assert torch._functorch.config.force_non_lazy_backward_lowering is False


def test_kernel_spec_arguments_a_torch_lacks_are_dropped_only_when_none(monkeypatch):
    monkeypatch.setitem(internals.SEAM[internals.torch_minor()], "CppCodeCache.load_async",
                        internals.SEAM[(2, 12)]["CppCodeCache.load_async"])
    args = {"main_code": "x", "device_type": "cpu", "extra_flags": (), "optimized_code": None,
            "needs_vec_isa": None, "kernel_needs_vec_isa": None}
    assert internals.load_async_args(args) == {
        "main_code": "x", "device_type": "cpu", "extra_flags": (), "optimized_code": None
    }
    with pytest.raises(ValueError, match="needs_vec_isa"):
        internals.load_async_args({**args, "needs_vec_isa": True})
