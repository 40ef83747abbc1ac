"""torchfarm/trust/provision.py: the secrets compose's init service makes."""

from __future__ import annotations

import json
import stat
import subprocess
import time

import pytest
import redis
from cryptography import x509
from cryptography.x509.oid import ExtensionOID

from cli.launch import redis_version
from torchfarm.trust import provision as prov
from torchfarm.trust.signing import Signer, TrustedKeys
from torchfarm.trust.tokens import TokenTable


def _run(out, **kw):
    args = dict(tenant="team-a", hosts=["coordinator", "127.0.0.1"],
                broker="redis-broker:6379", cache="redis-cache:6380")
    args.update(kw)
    return prov.provision(out, **args)


def test_each_reader_gets_only_its_own_files(tmp_path):
    client = _run(tmp_path)
    assert sorted(client) == ["ca.crt", "token", "trusted-keys.json"]
    names = {d: sorted(p.name for p in (tmp_path / d).iterdir()) for d in
             ("coordinator", "worker", "redis", "ca", "grafana")}
    assert names["coordinator"] == ["broker-url", "cache-url", "state-url", "tls.crt", "tls.key",
                                    "tokens.json", "trusted-keys.json"]
    assert names["worker"] == ["broker-url", "cache-url", "signing-key.pem", "state-url"]
    assert names["ca"] == ["ca.key"]
    assert names["grafana"] == ["admin-password"]
    for secret in ("coordinator/tls.key", "coordinator/tokens.json", "coordinator/broker-url",
                   "worker/signing-key.pem", "worker/cache-url", "client/token", "ca/ca.key"):
        assert stat.S_IMODE((tmp_path / secret).stat().st_mode) == 0o600, secret


def test_the_token_is_in_the_coordinators_table_and_the_pin_is_the_workers_key(tmp_path):
    _run(tmp_path)
    token = (tmp_path / "client/token").read_text().strip()
    tenant = TokenTable.from_file(tmp_path / "coordinator/tokens.json").lookup(token)
    assert tenant is not None and tenant.name == "team-a"
    signer = Signer.from_file(tmp_path / "worker/signing-key.pem")
    pins = TrustedKeys.load(str(tmp_path / "client/trusted-keys.json"))
    assert json.loads((tmp_path / "client/trusted-keys.json").read_text()) == signer.trusted_entry()
    assert list(pins.keys) == [signer.key_id]


def test_the_server_certificate_is_the_cas_and_names_the_hosts(tmp_path):
    _run(tmp_path, hosts=["coordinator", "farm.example.com", "10.0.0.5"])
    ca = x509.load_pem_x509_certificate((tmp_path / "client/ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "coordinator/tls.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    assert san.get_values_for_type(x509.DNSName) == ["coordinator", "farm.example.com"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]


def test_a_second_run_rotates_nothing(tmp_path):
    _run(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    _run(tmp_path)
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before


def test_a_deleted_certificate_is_issued_again_by_the_same_ca(tmp_path):
    _run(tmp_path)
    ca_before = (tmp_path / "client/ca.crt").read_bytes()
    (tmp_path / "coordinator/tls.crt").unlink()
    _run(tmp_path, hosts=["coordinator", "new.example.com"])
    assert (tmp_path / "client/ca.crt").read_bytes() == ca_before
    ca = x509.load_pem_x509_certificate(ca_before)
    x509.load_pem_x509_certificate((tmp_path / "coordinator/tls.crt").read_bytes()).verify_directly_issued_by(ca)


def test_each_role_has_its_own_password_in_its_urls(tmp_path):
    _run(tmp_path)
    coord = (tmp_path / "coordinator/broker-url").read_text().strip()
    worker = (tmp_path / "worker/broker-url").read_text().strip()
    assert coord.startswith("redis://coordinator:") and coord.endswith("@redis-broker:6379/0")
    assert worker.startswith("redis://worker:") and worker.endswith("@redis-broker:6379/0")
    assert (tmp_path / "worker/cache-url").read_text().strip().endswith("@redis-cache:6380/0")
    assert coord.split(":")[2].split("@")[0] != worker.split(":")[2].split("@")[0]


def test_the_state_redis_has_passwords_of_its_own(tmp_path):
    _run(tmp_path, state="redis-state:6381")

    def password(url_file: str) -> str:
        return (tmp_path / url_file).read_text().strip().split(":")[2].split("@")[0]

    for role in prov.ROLES:
        state = (tmp_path / role / "state-url").read_text().strip()
        assert state.startswith(f"redis://{role}:") and state.endswith("@redis-state:6381/0")
        assert password(f"{role}/state-url") != password(f"{role}/cache-url")
        assert f"user {role} on >{password(f'{role}/state-url')} " in (tmp_path / "redis/state.acl").read_text()
    assert password("coordinator/state-url") != password("worker/state-url")


def test_main_reads_its_defaults_from_the_environment(tmp_path):
    seen = {}
    prov.main([str(tmp_path)], env={"TORCHFARM_PROVISION_HOSTS": "a, b", "TORCHFARM_PROVISION_TENANT": "t"},
              run=lambda out, **kw: seen.update(kw, out=out) or {})
    assert (seen["hosts"], seen["tenant"], seen["broker"]) == (["a", "b"], "t", "redis-broker:6379")
    assert seen["state"] == "redis-state:6379"


@pytest.fixture
def broker(tmp_path):
    """A real redis-server loading provision's broker.acl; yields its port."""
    from localfarm.stack import free_port

    port = free_port()
    _run(tmp_path, broker=f"127.0.0.1:{port}")
    # From 7.0 Redis refuses MODULE and DEBUG whoever asks unless told otherwise; enabled
    # here, only the ACL refuses them.
    enabled = ["--enable-module-command", "yes", "--enable-debug-command", "yes"] if redis_version() >= (7, 0) else []
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--aclfile", str(tmp_path / "redis/broker.acl"), "--dir", str(tmp_path), *enabled],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        anon = redis.Redis(port=port)
        for _ in range(100):
            try:
                assert anon.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.integration
def test_redis_accepts_each_role_and_the_anonymous_user_only_pings(tmp_path, broker):
    """The ACL file as a real redis-server loads it."""
    with pytest.raises(redis.exceptions.NoPermissionError):
        redis.Redis(port=broker).get("k")
    for role in prov.ROLES:
        r = redis.Redis.from_url((tmp_path / role / "broker-url").read_text().strip())
        r.set(f"k-{role}", "v")
        assert r.get(f"k-{role}") == b"v"
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(port=broker, username="worker", password="wrong").ping()


# What a leaked role password must not do to the server: wipe it whole, stop it, rewrite
# its settings (memory, persistence, files), make it a replica of another host (whose
# data it would then serve, the first step of loading a module from it), or load a module.
SERVER_COMMANDS = [("FLUSHALL",), ("FLUSHDB",), ("SWAPDB", "0", "1"), ("CONFIG", "SET", "maxmemory", "1"),
                   ("CONFIG", "GET", "dir"), ("REPLICAOF", "127.0.0.1", "1"), ("SHUTDOWN", "NOSAVE"),
                   ("MODULE", "LOAD", "/tmp/x.so"), ("BGSAVE",), ("ACL", "SETUSER", "x", "on"),
                   ("CLIENT", "KILL", "TYPE", "normal"), ("DEBUG", "SLEEP", "0")]


@pytest.mark.integration
@pytest.mark.parametrize("command", SERVER_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_role_may_not_run_server_commands(tmp_path, broker, command):
    for role in prov.ROLES:
        r = redis.Redis.from_url((tmp_path / role / "broker-url").read_text().strip())
        r.set("kept", "1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.execute_command(*command)
        assert r.get("kept") == b"1"


@pytest.mark.integration
def test_a_role_may_run_what_the_farm_runs(tmp_path, broker):
    """Scripts, pub/sub, transactions, scans, INFO (the queue gauges' memory) and the
    client's name, which redis-py, Celery and kombu send."""
    r = redis.Redis.from_url((tmp_path / "worker" / "broker-url").read_text().strip())
    assert r.eval("return redis.call('SET', KEYS[1], ARGV[1])", 1, "k", "v") == b"OK"
    assert r.publish("ch", "m") == 0
    with r.pipeline(transaction=True) as p:
        p.watch("k")
        p.multi()
        p.lpush("q", "x")
        p.execute()
    assert sorted(r.scan_iter()) == [b"k", b"q"]
    assert r.info()["used_memory"] > 0
    assert r.client_setname("worker-1")
