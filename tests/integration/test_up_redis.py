"""`torchfarm up`'s Redis, as `up` starts it (its real redis-servers; the coordinator and
the workers not started): on a shared host any local user reaches 127.0.0.1, so a Redis
without a password would hand them every tenant's requests and artifacts, and the farm's
state, whatever tokens `--auth` requires. The data dir's files are its user's alone."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest
import redis

from cli import launch, main, up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class _CoordinatorNext(Exception):
    """Raised where `up` would start the coordinator: its Redis is up by then."""


@pytest.fixture(params=[[], ["--cache-memory", "0"]], ids=["cache-apart", "one-redis"])
def farm(request, monkeypatch, tmp_path):
    spawned: dict[str, dict[str, str]] = {}
    real_spawn = launch.spawn

    def spawn(cmd, env, log):
        if log.stem == "coordinator":
            spawned["coordinator"] = env
            raise _CoordinatorNext
        return real_spawn(cmd, env, log)

    monkeypatch.setattr(launch, "spawn", spawn)
    argv = ["up", "--auth", "alice", "--data-dir", str(tmp_path / "data"), "--grpc-port", str(launch.free_port()),
            *request.param]
    args = main.build_parser().parse_args(argv)
    farm = up._Farm(args, up.Layout(args.data_dir, persistent=True).make(), threading.Event())
    try:
        with pytest.raises(_CoordinatorNext):
            farm.start()
        yield farm, spawned["coordinator"]
    finally:
        farm.stop()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_client_without_the_password_is_refused(farm):
    farm, _ = farm
    redis.Redis.from_url(farm.redis_url).set("tf:req:alice:" + "ab" * 32, b"alice's graph")
    for port in {farm.redis_port, farm.cache_port or farm.redis_port}:
        for db in (0, 1):
            stranger = redis.Redis(host="127.0.0.1", port=port, db=db)
            with pytest.raises((redis.AuthenticationError, redis.exceptions.NoPermissionError)):
                stranger.get("tf:req:alice:" + "ab" * 32)
            with pytest.raises((redis.AuthenticationError, redis.exceptions.NoPermissionError)):
                stranger.set("tf:stranger", b"1")
            with pytest.raises((redis.AuthenticationError, redis.exceptions.NoPermissionError)):
                stranger.config_get("requirepass")


def test_the_farms_own_user_may_not_administer_the_server(farm):
    farm, _ = farm
    r = redis.Redis.from_url(farm.redis_url)
    for command in (("CONFIG", "SET", "maxmemory", "1"), ("FLUSHALL",), ("REPLICAOF", "127.0.0.1", "1")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.execute_command(*command)


def test_the_password_reaches_the_processes_in_files_only_their_user_reads(farm):
    farm, env = farm
    for name in ("BROKER_URL", "CACHE_URL", "STATE_URL"):
        assert f"TORCHFARM_{name}" not in env  # the environment would show the password
        path = Path(env[f"TORCHFARM_{name}_FILE"])
        assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
        assert redis.Redis.from_url(path.read_text().strip()).ping()
    password = farm.layout.keys / "redis.password"
    assert _mode(password) == 0o600
    assert password.read_text().strip() not in " ".join(farm.supervisor.children["redis"].proc.args)


def test_the_data_dirs_are_the_users_alone(farm):
    farm, _ = farm
    layout = farm.layout
    for d in (layout.redis, layout.cache, layout.logs, layout.keys):
        assert _mode(d) == 0o700, d
    for f in layout.keys.iterdir():
        assert _mode(f) & 0o077 == 0 or f.name == "trusted-keys.json", f


def test_the_acl_names_pub_sub_channels_only_where_the_redis_reads_them(monkeypatch, tmp_path):
    # `&*` (all pub/sub channels) is Redis 6.2's syntax, and 7.0 denies every channel to
    # a user without it; 6.0 and 6.1 refuse to start on an ACL file that has it.
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    monkeypatch.setattr(launch, "redis_version", lambda: (6, 0))
    acl, password = up._redis_acl(keys)
    assert f"user farm on >{password} ~* +@all" in acl.read_text()
    monkeypatch.setattr(launch, "redis_version", lambda: (7, 0))
    assert "~* &* +@all" in up._redis_acl(keys)[0].read_text()


def test_up_refuses_a_redis_without_acls_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, "redis_version", lambda: (5, 0))
    args = main.build_parser().parse_args(["up", "--grpc-port", str(launch.free_port())])
    with pytest.raises(up.CliError, match="redis-server 6.0 or later.*5.0"):
        up.run(args)


def test_the_installed_redis_servers_version_is_read():
    major, minor = launch.redis_version()
    assert major >= 6 and minor >= 0
