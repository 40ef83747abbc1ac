"""The mypy gate of `make lint` (issue 15): strict where pyproject.toml says, and no blanket ignores.

mypy itself is what `make lint` runs; these tests pin what its configuration must keep
saying, so that a later edit cannot quietly switch the strict layers off.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = ("torchfarm", "sdk", "services", "workers", "cli", "localfarm")
STRICT_LAYERS = {"torchfarm.*", "services.*", "sdk.*"}
"""The torch-free contract (less the packages below), the coordinator, and the SDK."""
DEFAULT_LAYERS = {"torchfarm.fx.*", "cli.*", "localfarm.*", "torchfarm.v1.*"}
"""Inside torchfarm/ but not the contract: torch-side shared code, the CLI, the local
stack, and the generated protobuf code."""


def _mypy_config() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]


def _override(config: dict[str, Any], modules: set[str]) -> dict[str, Any]:
    found = [o for o in config["overrides"] if set(o["module"]) == modules]
    assert len(found) == 1, f"want one [[tool.mypy.overrides]] for exactly {sorted(modules)}"
    return found[0]


def _strict_flags() -> list[tuple[str, bool]]:
    """What `mypy --strict` sets, from mypy itself, so a new strict flag is noticed."""
    main = pytest.importorskip("mypy.main")
    _, _, assignments = main.define_options()
    return assignments


def test_mypy_checks_every_project_package():
    assert set(_mypy_config()["files"]) == set(PROJECT_PACKAGES)


def test_the_strict_layers_get_every_strict_flag():
    # `strict = true` in an override applies to every module (mypy 2.4), hence the
    # flags one by one; each must be on for the strict layers, there or globally.
    config = _mypy_config()
    strict = _override(config, STRICT_LAYERS)
    assert "strict" not in strict and "strict" not in config
    missing = [
        (flag, value) for flag, value in _strict_flags()
        if strict.get(flag, config.get(flag)) != value
    ]
    assert not missing, f"flags --strict sets that the strict layers lack: {missing}"


def test_the_non_contract_packages_get_mypy_defaults():
    config = _mypy_config()
    default = _override(config, DEFAULT_LAYERS)
    per_module = [(f, v) for f, v in _strict_flags() if f in _override(config, STRICT_LAYERS)]
    assert [(f, default.get(f)) for f, _ in per_module] == [(f, not v) for f, v in per_module]


def test_no_blanket_ignores_for_project_modules():
    for override in _mypy_config()["overrides"]:
        assert "ignore_errors" not in override, override
        if override.get("ignore_missing_imports"):
            ours = [m for m in override["module"] if m.split(".")[0] in PROJECT_PACKAGES]
            assert not ours, f"project modules must be found, not ignored: {ours}"


_IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[a-z0-9-]+(,\s*[a-z0-9-]+)*\])?")


@pytest.mark.parametrize("package", PROJECT_PACKAGES)
def test_every_type_ignore_names_its_code(package):
    bare = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue  # generated
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in _IGNORE.finditer(line):
                if m.group("codes") is None:
                    bare.append(f"{path.relative_to(ROOT)}:{n}")
    assert not bare, f"`# type: ignore` without an error code: {bare}"
