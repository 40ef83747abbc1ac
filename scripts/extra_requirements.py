"""Prints the requirements of pyproject.toml's core dependencies and the named extras, one
per line, with the project's references to its own extras ("torchfarm[sdk]") expanded.

The images install these before they copy the source, so the layer with torch, Triton and
the rest changes only when the dependencies do, not with every commit:

    python extra_requirements.py worker,kernels > /tmp/requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def requirements(project: dict, extras: list[str]) -> list[str]:
    """The core dependencies and those of `extras`, in order, each once."""
    name = project["name"]
    found: list[str] = list(project.get("dependencies", []))
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        if extra not in project.get("optional-dependencies", {}):
            raise SystemExit(f"pyproject.toml has no extra {extra!r}")
        seen.add(extra)
        for req in project["optional-dependencies"][extra]:
            own = re.fullmatch(rf"{re.escape(name)}\[([\w,\s-]+)\]", req.strip())
            if own:
                todo += [e.strip() for e in own.group(1).split(",")]
            elif req not in found:
                found.append(req)
    return found


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python extra_requirements.py EXTRA[,EXTRA...]  (beside pyproject.toml)")
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    print("\n".join(requirements(project, [e for e in argv[1].split(",") if e])))


if __name__ == "__main__":
    main(sys.argv)
