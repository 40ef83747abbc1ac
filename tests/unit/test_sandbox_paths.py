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
    secrets = tmp_path / "secrets"
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


def test_a_python_under_tmp_is_bound_back_read_only_but_never_tmp_or_the_scratch(tmp_path, monkeypatch):
    """The child's /tmp is a private tmpfs: a venv or checkout under /tmp would vanish
    (bwrap: execvp .../python: No such file). Those directories are bound back, read
    only, before the hidden paths; /tmp itself and a directory above the scratch are not
    (they would show other runs' scratch directories)."""
    import sys

    from workers.sandbox import python_under_tmp

    checkout = tmp_path / "checkout"
    (checkout / "pkg").mkdir(parents=True)
    scratch = tmp_path / "box" / "tfjob-1"
    scratch.mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(checkout), str(checkout / "pkg"), "/tmp", str(tmp_path / "box"), "/usr/lib"])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    bound = python_under_tmp(str(scratch))
    assert str(checkout) in bound and str(checkout / "pkg") not in bound  # the outer one covers it
    assert "/tmp" not in bound and str(tmp_path / "box") not in bound and "/usr/lib" not in bound
    argv = bwrap_argv(str(scratch), ("/etc/torchfarm",))
    assert argv.index(str(checkout)) < argv.index("--bind")


def test_a_checkout_under_tmp_found_only_through_the_working_directory_is_bound_back(tmp_path, monkeypatch):
    """`python -c` in a checkout under /tmp imports the farm through '' (the working
    directory): the child, which runs `-m workers.sandbox.child`, needs the checkout bound
    back too (it failed with "No module named 'workers'")."""
    import sys

    from workers.sandbox import python_under_tmp

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    monkeypatch.setattr(sys, "path", ["", "/usr/lib"])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert str(checkout) in python_under_tmp(str(tmp_path / "box" / "tfjob-1"))


def test_the_packages_the_child_imports_are_bound_back_wherever_they_were_found(tmp_path, monkeypatch):
    """An editable install maps `workers` and `torchfarm` to a checkout that is on no
    import path: the directory each was imported from is bound back."""
    import sys
    import types

    from workers.sandbox import python_under_tmp

    checkout = tmp_path / "checkout"
    (checkout / "workers").mkdir(parents=True)
    fake = types.ModuleType("workers")
    fake.__file__ = str(checkout / "workers" / "__init__.py")
    monkeypatch.setitem(sys.modules, "workers", fake)
    monkeypatch.setattr(sys, "path", ["/usr/lib"])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert str(checkout) in python_under_tmp(str(tmp_path / "box" / "tfjob-1"))
