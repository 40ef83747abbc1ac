"""Unknown `TORCHFARM_*` names are warned of (torchfarm/envnames.py): a typo such as
`TORCHFARM_FALLBAK=error` must not pass silently for a setting."""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys

import pytest

from sdk.settings import SDKSettings
from services.coordinator.settings import CoordinatorSettings
from tests.conftest import ROOT
from torchfarm import envnames, settings
from torchfarm.settings import from_env
from workers.settings import WorkerSettings


@pytest.fixture(autouse=True)
def _fresh_warnings():
    settings.forget_warnings()
    yield
    settings.forget_warnings()


@pytest.mark.parametrize("cls", [SDKSettings, CoordinatorSettings, WorkerSettings])
def test_every_setting_is_a_known_name(cls):
    names = {envnames.PREFIX + f.name.upper() for f in dataclasses.fields(cls)}
    assert not [n for n in names if not envnames.is_known(n)]


def test_every_name_the_repository_uses_is_known():
    """Code, scripts, compose and k8s files (docs may show patterns such as TORCHFARM_TLS_*)."""
    out = subprocess.run(
        ["git", "grep", "-ohE", r"TORCHFARM_[A-Z0-9_]*[A-Z0-9]\b[_*]?", "--", ":!*.md",
         ":!torchfarm/envnames.py", ":!tests/unit/test_envnames.py"],  # they name misspellings
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    used = {n for n in out if not n.endswith(("_", "*"))}
    assert used and not [n for n in used if not envnames.is_known(n)]


def test_a_misspelt_setting_is_warned_of_with_the_name_it_misspells(caplog):
    caplog.set_level(logging.WARNING, logger="torchfarm.settings")
    env = {"TORCHFARM_FALLBAK": "error", "TORCHFARM_REMOTE": "grpc://127.0.0.1:1",
           "TORCHFARM_TOKEN_FILE": "/dev/null", "TORCHFARM_LISTEN": "0.0.0.0:1", "TORCHFARM_ZZZ": "1"}
    s = from_env(SDKSettings, env)
    assert s.fallback == "local"  # still ignored: warned of, not guessed at
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "TORCHFARM_FALLBAK is not a torchfarm setting and is ignored (did you mean TORCHFARM_FALLBACK?)",
        "TORCHFARM_ZZZ is not a torchfarm setting and is ignored",
    ]
    from_env(SDKSettings, env)  # once a process
    assert len(caplog.records) == 2


def test_sdk_compile_in_a_fresh_process_says_the_name_is_misspelt():
    code = "import torch, sdk; sdk.compile(torch.nn.Linear(2, 2))"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "TORCHFARM_FALLBAK": "error"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"TORCHFARM_FALLBAK is not a torchfarm setting .*did you mean TORCHFARM_FALLBACK", proc.stderr)
