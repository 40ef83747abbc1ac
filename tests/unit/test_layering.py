"""The import rules of ARCHITECTURE.md, checked rather than hoped for."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_coordinator_does_not_import_torch():
    code = (
        "import sys; import services.coordinator.server, services.coordinator.farm; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_sdk_imports_nothing_from_services_or_workers():
    offenders = []
    for path in (ROOT / "sdk").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.name}: {n}" for n in names if n.split(".")[0] in ("services", "workers")
            ]
    assert offenders == []
