"""ARCHITECTURE.md is a codemap: every module can be found from it, and it stays short."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODEMAP = (ROOT / "ARCHITECTURE.md").read_text()


def _modules() -> list[Path]:
    found = []
    for package in ("torchfarm", "sdk", "services", "workers", "cli", "localfarm"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name in ("__init__.py", "__main__.py") or path.parent.name == "v1":
                continue
            found.append(path.relative_to(ROOT))
    return found


def test_every_module_is_named_in_the_codemap():
    missing = [str(p) for p in _modules() if f"`{p.name}`" not in CODEMAP and f"`{p}`" not in CODEMAP]
    assert missing == []


def test_every_package_folder_is_named_in_the_codemap():
    folders = {str(p.parent) for p in _modules()} - {"torchfarm"}
    assert sorted(f for f in folders if f"{f}/" not in CODEMAP) == []


def test_the_codemap_reads_in_five_minutes():
    assert len(CODEMAP.split()) <= 1500
