"""What a bwrap child is told to hide (workers/sandbox/process.py `hidden_paths`): mount points
bwrap can make inside its new root."""

from __future__ import annotations

import os

from workers.sandbox import bwrap_argv, hidden_paths


def test_a_path_through_a_symlinked_parent_is_hidden_at_its_real_place(tmp_path):
    # Debian images have /var/run -> /run: bwrap cannot make /newroot/var/run/secrets,
    # which points out of the new root ("Can't mkdir /var/run/secrets").
    (tmp_path / "run" / "secrets").mkdir(parents=True)
    (tmp_path / "var").mkdir()
    os.symlink(tmp_path / "run", tmp_path / "var" / "run")
    hidden = hidden_paths((), (str(tmp_path / "var" / "run" / "secrets"),))
    assert str(tmp_path / "run" / "secrets") in hidden
    assert not any("/var/run" in p for p in hidden)


def test_a_key_file_inside_a_hidden_directory_is_covered_by_its_tmpfs(tmp_path):
    import shutil
    from pathlib import Path

    outside = Path(_outside_tmp(tmp_path))  # a directory under /tmp is emptied with /tmp
    try:
        secrets = outside / "secrets"
        (secrets / "torchfarm").mkdir(parents=True)
        key = secrets / "torchfarm" / "signing.key"
        key.write_text("k")
        elsewhere = tmp_path / "record.key"
        elsewhere.write_text("r")
        hidden = hidden_paths((str(key), str(elsewhere)), (str(secrets),))
        assert str(key) not in hidden and str(secrets) in hidden and str(elsewhere) in hidden
        argv = bwrap_argv(str(tmp_path / "scratch"), hidden)
        assert argv[argv.index(str(secrets)) - 1] == "--tmpfs"
        assert argv[argv.index(str(elsewhere)) - 2:argv.index(str(elsewhere))] == ["--ro-bind", "/dev/null"]
    finally:
        shutil.rmtree(outside)


def test_the_forkserver_empties_a_place_but_never_the_directory_it_keeps(tmp_path):
    """After a run, the server empties its /tmp: everything a run left there, except its
    own directory (bound into /tmp, so under a directory bwrap made there) and what is
    above it."""
    from workers.sandbox.child import _empty

    keep = tmp_path / "made" / "tfbox-1"
    (keep / "tfjob-1").mkdir(parents=True)
    (keep / "tfjob-1" / "out.bin").write_bytes(b"x")
    (tmp_path / "made" / "left").write_text("l")
    (tmp_path / "dir" / "deep").mkdir(parents=True)
    (tmp_path / "file").write_text("f")
    os.symlink("/etc/passwd", tmp_path / "link")
    _empty(str(tmp_path), str(keep))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["made"]
    assert sorted(p.name for p in (tmp_path / "made").iterdir()) == ["tfbox-1"]
    assert (keep / "tfjob-1" / "out.bin").read_bytes() == b"x"
    assert os.path.exists("/etc/passwd")


def test_the_forkserver_reads_its_requests_a_line_at_a_time(tmp_path):
    from workers.sandbox.child import _Lines

    read, write = os.pipe()
    os.write(write, b'{"scratch": "a"}\n{"scratch"')
    lines = _Lines(read)
    assert lines.next() == '{"scratch": "a"}'
    os.write(write, b': "b"}\n')
    os.close(write)
    assert lines.next() == '{"scratch": "b"}'
    assert lines.next() is None
    os.close(read)


def test_a_python_to_bind_back_is_bound_back_read_only_but_never_tmp_or_the_scratch(tmp_path, monkeypatch):
    """The child's /tmp is a private tmpfs: a venv or checkout under /tmp would vanish
    (bwrap: execvp .../python: No such file). Those directories are bound back, read
    only, before the hidden paths; /tmp itself and a directory above the scratch are not
    (they would show other runs' scratch directories)."""
    import sys

    from workers.sandbox import python_to_bind_back

    checkout = tmp_path / "checkout"
    (checkout / "pkg").mkdir(parents=True)
    scratch = tmp_path / "box" / "tfjob-1"
    scratch.mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(checkout), str(checkout / "pkg"), "/tmp", str(tmp_path / "box"), "/usr/lib"])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    bound = python_to_bind_back(str(scratch))
    assert str(checkout) in bound and str(checkout / "pkg") not in bound  # the outer one covers it
    assert "/tmp" not in bound and str(tmp_path / "box") not in bound and "/usr/lib" not in bound
    argv = bwrap_argv(str(scratch), ("/etc/torchfarm",))
    assert argv.index(str(checkout)) < argv.index("--bind")


def test_a_checkout_under_tmp_found_only_through_the_working_directory_is_bound_back(tmp_path, monkeypatch):
    """`python -c` in a checkout under /tmp imports the farm through '' (the working
    directory): the child, which runs `-m workers.sandbox.child`, needs the checkout bound
    back too (it failed with "No module named 'workers'")."""
    import sys

    from workers.sandbox import python_to_bind_back

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    monkeypatch.setattr(sys, "path", ["", "/usr/lib"])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert str(checkout) in python_to_bind_back(str(tmp_path / "box" / "tfjob-1"))


def test_the_packages_the_child_imports_are_bound_back_wherever_they_were_found(tmp_path, monkeypatch):
    """An editable install maps `workers` and `torchfarm` to a checkout that is on no
    import path: the directory each was imported from is bound back."""
    import sys
    import types

    from workers.sandbox import python_to_bind_back

    checkout = tmp_path / "checkout"
    (checkout / "workers").mkdir(parents=True)
    fake = types.ModuleType("workers")
    fake.__file__ = str(checkout / "workers" / "__init__.py")
    monkeypatch.setitem(sys.modules, "workers", fake)
    monkeypatch.setattr(sys, "path", ["/usr/lib"])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert str(checkout) in python_to_bind_back(str(tmp_path / "box" / "tfjob-1"))


def _bwrap_or_skip() -> None:
    import shutil

    import pytest

    from workers import sandbox

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    ok, why = sandbox.bwrap_works()
    if not ok:
        pytest.skip(why)


def _outside_tmp(tmp_path):
    """A fresh directory outside /tmp (the shipped images' TMPDIR is
    /var/cache/torchfarm/tmp), removed with tmp_path's."""
    import tempfile

    place = tempfile.mkdtemp(prefix="torchfarm-test-", dir="/var/tmp")
    os.symlink(place, tmp_path / "outside")
    return place


def _child_reads(argv_prefix: list[str], path: str) -> bool:
    import subprocess

    done = subprocess.run([*argv_prefix, "cat", path], capture_output=True, text=True, timeout=60, check=False)
    return done.returncode == 0


def test_a_child_cannot_read_the_runs_beside_its_own_where_scratch_lies_outside_tmp(tmp_path):
    """Runs of other pool processes (other tenants) lie beside this run's scratch: the
    shipped images' scratch root is not under /tmp, which is all a child's private /tmp
    replaced. A child that a tenant's input took over read their requests from there."""
    import shutil

    _bwrap_or_skip()
    root = _outside_tmp(tmp_path)
    try:
        other = os.path.join(root, "tfjob-other")
        os.makedirs(other)
        with open(os.path.join(other, "request.json"), "w") as f:
            f.write("another tenant's graph")
        mine = os.path.join(root, "tfjob-mine")
        os.makedirs(mine)
        assert not _child_reads(bwrap_argv(mine, ()), os.path.join(other, "request.json"))
        with open(os.path.join(mine, "own"), "w") as f:
            f.write("mine")
        assert _child_reads(bwrap_argv(mine, ()), os.path.join(mine, "own"))
    finally:
        shutil.rmtree(root)


def test_a_child_cannot_read_the_workers_secret_files_or_caches(tmp_path):
    """Every `TORCHFARM_*_FILE` (a Redis URL with its password), the worker's own
    Inductor and Triton caches (other tenants' compiled graphs) and the usual cloud
    credentials are hidden, wherever the operator put them."""
    import shutil

    from torchfarm.settings import from_env
    from workers import sandbox
    from workers.settings import WorkerSettings

    _bwrap_or_skip()
    root = _outside_tmp(tmp_path)
    try:
        url = os.path.join(root, "cache-url")
        with open(url, "w") as f:
            f.write("redis://:password@redis:6379/0")
        cache = os.path.join(root, "inductor")
        os.makedirs(cache)
        with open(os.path.join(cache, "entry"), "w") as f:
            f.write("another tenant's kernel")
        aws = os.path.join(root, "home", ".aws")
        os.makedirs(aws)
        with open(os.path.join(aws, "credentials"), "w") as f:
            f.write("[default]")
        env = {"TORCHFARM_CACHE_URL_FILE": url, "TORCHINDUCTOR_CACHE_DIR": cache, "HOME": os.path.join(root, "home")}
        box = sandbox.for_worker(from_env(WorkerSettings, env), "bwrap", environ=env)
        scratch = str(tmp_path / "scratch")
        os.makedirs(scratch)
        for secret in (url, os.path.join(cache, "entry"), os.path.join(aws, "credentials")):
            assert not _child_reads(bwrap_argv(scratch, box.hidden), secret), secret
    finally:
        shutil.rmtree(root)
