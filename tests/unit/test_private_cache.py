"""The SDK verifies an artifact's bytes, but Inductor imports the wrapper from its cache
directory (writing it only where no file exists) and dlopens kernels from there later.
So a directory another user can write, such as a `/tmp/torchinductor_<user>` they made
first, is refused before anything is written or loaded (sdk/loader.check_private_cache)."""

from __future__ import annotations

import grp
import os
import re

import pytest

from sdk import artifact, loader
from sdk.errors import ConfigError
from torchfarm.wire.manifest import BlobRef, Manifest


def _manifest() -> Manifest:
    return Manifest(key="k" * 64, fingerprint={}, payload=BlobRef("sha256:" + "0" * 64, 1))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    directory = tmp_path / "inductor"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(directory))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    return directory


@pytest.mark.parametrize("mode", [0o777, 0o757, 0o703])
def test_a_cache_dir_others_may_write_is_refused_before_loading(cache, mode):
    cache.chmod(mode)
    with pytest.raises(ConfigError, match="writable by others"):
        artifact.load(_manifest(), {})
    assert list(cache.iterdir()) == []


def test_a_group_may_write_it_only_when_the_group_is_the_users_own(cache):
    own = os.getgid()
    others = next((g.gr_gid for g in grp.getgrall() if g.gr_gid != own), None)
    if others is None or os.getuid() != 0:
        pytest.skip("needs a second group and the right to give the directory to it")
    cache.chmod(0o770)
    os.chown(cache, -1, others)
    with pytest.raises(ConfigError, match="writable by others"):
        loader.check_private_cache()
    os.chown(cache, -1, own)
    if not grp.getgrgid(own).gr_mem:  # a private group, as umask 002 distributions make one per user
        loader.check_private_cache()


def test_a_shared_triton_cache_dir_is_refused(cache, tmp_path, monkeypatch):
    shared = tmp_path / "triton"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(shared))
    with pytest.raises(ConfigError, match=re.escape(f"{shared} is writable by others")):
        loader.check_private_cache()


def test_a_private_cache_dir_passes_and_one_inductor_makes_too(cache, monkeypatch):
    loader.check_private_cache()
    cache.chmod(0o755)
    loader.check_private_cache()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache / "not-yet"))
    loader.check_private_cache()
