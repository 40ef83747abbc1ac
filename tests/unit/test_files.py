"""`write_atomic`: the whole file or the old one, never a link followed, nothing left over."""

from __future__ import annotations

import json
import os
import stat

import pytest

from torchfarm.files import others_may_write, replaceable_above, write_atomic
from torchfarm.trust import tokens


def test_a_file_is_replaced_whole_with_the_mode_asked_for(tmp_path):
    path = tmp_path / "lib.so"
    path.write_bytes(b"old")
    write_atomic(path, b"new bytes", mode=0o755)
    assert path.read_bytes() == b"new bytes" and stat.S_IMODE(path.stat().st_mode) == 0o755
    write_atomic(path, b"private")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["lib.so"]


def test_a_link_at_the_path_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    (tmp_path / "tokens.json").symlink_to(victim)
    write_atomic(tmp_path / "tokens.json", b"{}")
    assert victim.read_bytes() == b"untouched"
    assert not (tmp_path / "tokens.json").is_symlink() and (tmp_path / "tokens.json").read_bytes() == b"{}"


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "record.json"
    path.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_atomic(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["record.json"]


def test_the_tokens_file_is_not_written_through_a_link_planted_at_a_temporary_name(tmp_path):
    """Its temporary file once had a name anyone could guess (`.tokens.json.<pid>.tmp`),
    opened without O_EXCL: a link planted there had its target truncated and rewritten."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    (tmp_path / f".tokens.json.{os.getpid()}.tmp").symlink_to(victim)
    tokens.add_to_file(tmp_path / "tokens.json", {"hash": "alice"})
    assert victim.read_bytes() == b"untouched"
    assert json.loads((tmp_path / "tokens.json").read_text()) == {"hash": "alice"}


@pytest.mark.parametrize("mode, private_group, others", [
    (0o755, False, False), (0o700, True, False), (0o757, True, True),
    (0o775, False, True),  # a group may write: only a caller that allows the user's private group asks further
])
def test_who_else_may_write(tmp_path, mode, private_group, others):
    tmp_path.chmod(mode)
    assert others_may_write(tmp_path.stat(), private_group) == others


def test_a_directory_of_another_users_above_a_file_is_named(tmp_path):
    """Its owner may rename anything in it, whatever its mode."""
    if os.getuid() != 0:
        pytest.skip("giving a directory away needs root")
    bob = tmp_path / "bob"
    (bob / "keys").mkdir(parents=True, mode=0o755)
    bob.chmod(0o755)
    (bob / "keys" / "k.json").write_text("{}")
    assert replaceable_above([bob / "keys" / "k.json"]) is None
    os.chown(bob, 12345, -1)
    assert f"{bob} is writable by others or owned by another user (uid 12345, mode 755)" in (
        replaceable_above([bob / "keys" / "k.json"]) or ""
    )
