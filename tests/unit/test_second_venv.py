"""tests/second_venv.py keeps one venv per torch and interpreter: a venv made for
requirements since changed is removed once a new one is made, unless a session holds it."""

from __future__ import annotations

import fcntl

from tests.second_venv import _remove_superseded


def test_superseded_venvs_go_unless_a_session_holds_them(tmp_path):
    names = ["torch-2.13.0-py311-aaa", "torch-2.13.0-py311-bbb", "torch-2.13.0-py311-ccc",
             "torch-2.12.1-py311-ddd", "torch-2.13.0-py312-eee"]
    for name in names:
        (tmp_path / name / "bin").mkdir(parents=True)
        (tmp_path / f"{name}.lock").touch()
    with open(tmp_path / "torch-2.13.0-py311-bbb.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        _remove_superseded(tmp_path / "torch-2.13.0-py311-ccc")
    left = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert left == ["torch-2.12.1-py311-ddd", "torch-2.13.0-py311-bbb", "torch-2.13.0-py311-ccc",
                    "torch-2.13.0-py312-eee"]
