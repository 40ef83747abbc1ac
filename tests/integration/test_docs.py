"""The user guide's examples run, against a real local farm (docs/sdk.md, "How the
examples are tested", defines the markers).

Every fenced `python` block of `docs/sdk*.md` runs in a fresh process unless a marker
says `skip REASON` or `file NAME`; `bash` blocks run when marked `run`. An `output`
block right after a run block is the expected stdout. Files the lead adds later
(docs/sdk-*.md) are picked up by the glob, and blocks merged into docs/sdk.md by
reading it.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(600)

DOCS = sorted((ROOT / "docs").glob("sdk*.md"))
MARKER = re.compile(r"<!--\s*test:\s*(run|skip|file)\b\s*(.*?)\s*-->")
FENCE = re.compile(r"^(```+)\s*([\w-]*)")
RUNNABLE = {"python", "bash", "sh"}
BLOCK_TIMEOUT_S = 600


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    lang: str
    code: str
    action: str
    """"run", "skip" or "file"; python blocks without a marker run."""
    arg: str = ""
    """skip: the reason; file: the file name."""
    expected: str | None = None

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def parse(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    raw: list[tuple[int, str, str, str, str]] = []  # line, lang, code, action, arg
    i, marker = 0, None
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            if lines[i].strip():
                m = MARKER.search(lines[i])
                marker = (m.group(1), m.group(2)) if m else None
            i += 1
            continue
        start, lang, body = i + 1, fence.group(2), []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence.group(1)):
            body.append(lines[i])
            i += 1
        i += 1
        action, arg = marker or ("run" if lang == "python" else "show", "")
        raw.append((start, lang, "\n".join(body) + "\n", action, arg))
        marker = None
    blocks: list[Block] = []
    for n, (line, lang, code, action, arg) in enumerate(raw):
        if lang == "output":
            continue
        follows = raw[n + 1] if n + 1 < len(raw) else None
        expected = None
        if follows and follows[1] == "output" and _only_blank_between(lines, line, code, follows[0]):
            expected = follows[2]
        blocks.append(Block(path.name, line, lang, code, action, arg, expected))
    return blocks


def _only_blank_between(lines: list[str], start: int, code: str, next_start: int) -> bool:
    end = start + code.count("\n")  # the closing fence's index
    return all(not l.strip() for l in lines[end + 1 : next_start - 1])


def test_every_block_is_run_or_marked():
    """Unit check of the guide's markers; needs no farm."""
    problems = []
    for doc in DOCS:
        for b in parse(doc):
            if b.action in ("skip", "file") and not b.arg:
                problems.append(f"{b.where}: '{b.action}' needs a {'reason' if b.action == 'skip' else 'name'}")
            if b.action == "run" and b.lang not in RUNNABLE:
                problems.append(f"{b.where}: cannot run a {b.lang or 'plain'} block")
            if b.expected is not None and b.action != "run":
                problems.append(f"{b.where}: an output block follows a block that does not run")
    assert problems == []
    assert any(b.action == "run" and b.lang == "python" for b in parse(ROOT / "docs" / "sdk.md"))


def matches(actual: str, expected: str) -> bool:
    """Line by line; `*` matches within a line, a line `...` matches any lines."""
    want = expected.strip("\n").splitlines()
    got = actual.strip("\n").splitlines()

    def walk(w: int, g: int) -> bool:
        if w == len(want):
            return g == len(got)
        if want[w].strip() == "...":
            return any(walk(w + 1, k) for k in range(g, len(got) + 1))
        return g < len(got) and fnmatch.fnmatchcase(got[g].rstrip(), want[w].rstrip()) and walk(w + 1, g + 1)

    return walk(0, 0)


def test_matches_wildcards():
    assert matches("a 1\nb\nc\n", "a *\n...\nc")
    assert not matches("a 1\nb\n", "a 2\nb")
    assert not matches("a\nb\nextra\n", "a\nb")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_examples_run_against_a_real_farm(doc, stack, tmp_path):
    env = {
        **os.environ,
        **stack.client_env(),
        "PYTHONPATH": str(ROOT),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }
    ran = 0
    for b in parse(doc):
        if b.action == "file":
            (tmp_path / b.arg).write_text(b.code)
            continue
        if b.action != "run" or b.lang not in RUNNABLE:
            continue
        script = tmp_path / f"block_{b.line}.{'py' if b.lang == 'python' else 'sh'}"
        script.write_text(b.code)
        cmd = [sys.executable, str(script)] if b.lang == "python" else ["bash", "-e", str(script)]
        out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=BLOCK_TIMEOUT_S)
        assert out.returncode == 0, f"{b.where} exited {out.returncode}:\n{out.stderr[-3000:]}"
        if b.expected is not None:
            assert matches(out.stdout, b.expected), (
                f"{b.where}: stdout\n{out.stdout}\ndoes not match\n{b.expected}"
            )
        ran += 1
    assert ran > 0 or not any(b.action == "run" for b in parse(doc))
