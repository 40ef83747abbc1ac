"""docker-compose.yml and the Dockerfiles, offline (there is no Docker engine here).

The compose file is validated against the Compose specification's JSON schema
(tests/schemas/compose-spec.json), then checked for what the farm needs; the
Dockerfiles are checked for the files and modules they name.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess

import jsonschema
import pytest
import yaml

from tests.ops.promql import ROOT
from torchfarm.celeryconf import HARD_TIME_LIMIT_S

COMPOSE = ROOT / "docker-compose.yml"
SCHEMA = ROOT / "tests/schemas/compose-spec.json"
SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"
"""The schema as vendored by check-jsonschema 0.39.0 (tests/schemas/README.md)."""


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration))


def _flags(command: list[str]) -> dict[str, str]:
    return {a: b for a, b in zip(command, command[1:], strict=False) if a.startswith("--")}


def test_schema_is_the_vendored_one():
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMA_SHA256


def test_compose_file_matches_the_compose_specification(compose):
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors, "\n".join(errors)


def test_the_schema_rejects_a_broken_file(compose):
    schema = json.loads(SCHEMA.read_text())
    bad = json.loads(json.dumps(compose))
    bad["services"]["coordinator"]["restart_policy"] = "always"  # not a service field
    bad["services"]["redis-cache"]["ports"] = "6379"  # must be a list
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(bad))
    assert len(errors) >= 2


def test_the_services_the_farm_needs(compose):
    assert set(compose["services"]) == {
        "init", "redis-broker", "redis-cache", "redis-state", "coordinator", "worker-cpu", "worker-cuda",
        "prometheus", "grafana"}


def test_broker_and_state_never_evict_and_cache_evicts_lru_under_a_limit(compose):
    broker = _flags(compose["services"]["redis-broker"]["command"])
    cache = _flags(compose["services"]["redis-cache"]["command"])
    state = _flags(compose["services"]["redis-state"]["command"])
    assert broker["--maxmemory-policy"] == "noeviction"
    assert state["--maxmemory-policy"] == "noeviction" and "--maxmemory" not in state
    assert state["--appendonly"] == "yes"
    assert _mounted(compose["services"]["redis-state"])["state-data"] == "/data"
    assert cache["--maxmemory-policy"] == "allkeys-lru"
    assert cache["--maxmemory"]


def test_processes_use_separate_redis_for_broker_and_cache(compose, tmp_path):
    """The URLs are files init writes (passwords in them); its defaults name the two
    instances, and each process reads the files of its own role."""
    from torchfarm.trust import provision

    provision.provision(tmp_path, tenant="t", hosts=["coordinator"],
                        broker="redis-broker:6379",
                        cache="redis-cache:6379", state="redis-state:6379")
    for name in ("coordinator", "worker-cpu", "worker-cuda"):
        env = compose["services"][name]["environment"]
        assert not {"TORCHFARM_BROKER_URL", "TORCHFARM_CACHE_URL", "TORCHFARM_STATE_URL"} & set(env)
        role = "coordinator" if name == "coordinator" else "worker"
        assert f"{role}-secrets:/run/secrets/torchfarm:ro" in compose["services"][name]["volumes"]
        for kind, host in (("BROKER", "redis-broker"), ("CACHE", "redis-cache"), ("STATE", "redis-state")):
            path = env[f"TORCHFARM_{kind}_URL_FILE"]
            url = (tmp_path / role / path.rpartition("/")[2]).read_text()
            assert url.startswith(f"redis://{role}:") and f"@{host}:6379/" in url


def _mounted(svc: dict) -> dict[str, str]:
    """Volume name → mount point, for named volumes."""
    out = {}
    for v in svc.get("volumes", []):
        source, target = v.split(":")[:2]
        if not source.startswith(("./", "/")):
            out[source] = target
    return out


def test_init_makes_the_secrets_and_everything_waits_for_it(compose):
    init = compose["services"]["init"]
    assert init["command"][:3] == ["python", "-m", "torchfarm.trust.provision"]
    assert init["network_mode"] == "none" and init["restart"] == "no"
    secret_volumes = {v for v in _mounted(init)}
    assert secret_volumes == {v for v in compose["volumes"] if v.endswith("-secrets")}
    for name, svc in compose["services"].items():
        if secret_volumes & set(_mounted(svc)) and name != "init":
            assert svc["depends_on"]["init"] == {"condition": "service_completed_successfully"}, name


def test_each_secret_volume_is_mounted_read_only_into_its_readers_only(compose):
    readers = {
        "coordinator-secrets": {"coordinator"}, "worker-secrets": {"worker-cpu", "worker-cuda"},
        "redis-secrets": {"redis-broker", "redis-cache", "redis-state"}, "grafana-secrets": {"grafana"},
        "client-secrets": set(), "ca-secrets": set(),
    }
    for volume, want in readers.items():
        got = {n for n, svc in compose["services"].items() if volume in _mounted(svc) and n != "init"}
        assert got == want, volume
        for n in got:
            assert f"{volume}:{_mounted(compose['services'][n])[volume]}:ro" in compose["services"][n]["volumes"]


def test_the_coordinator_requires_tokens_and_tls_and_workers_sign(compose):
    env = compose["services"]["coordinator"]["environment"]
    for var in ("TORCHFARM_TOKENS_FILE", "TORCHFARM_TLS_CERT_FILE", "TORCHFARM_TLS_KEY_FILE",
                "TORCHFARM_TRUSTED_KEYS_FILE"):
        assert env[var].startswith("/run/secrets/torchfarm/"), var
    for name in ("worker-cpu", "worker-cuda"):
        assert compose["services"][name]["environment"]["TORCHFARM_SIGNING_KEY_FILE"].endswith("signing-key.pem")


def test_redis_has_users_per_role_and_no_secret_sits_in_the_file(compose):
    for name in ("redis-broker", "redis-cache", "redis-state"):
        flags = _flags(compose["services"][name]["command"])
        assert flags["--aclfile"].startswith("/run/secrets/torchfarm/")
    text = COMPOSE.read_text()
    assert not re.search(r"redis://[^\s\"]*@", text), "a password in a URL"
    assert "GF_SECURITY_ADMIN_PASSWORD:" not in text and "GF_SECURITY_ADMIN_PASSWORD__FILE" in text


def test_monitoring_is_published_on_loopback_only(compose):
    for name in ("prometheus", "grafana"):
        for port in compose["services"][name]["ports"]:
            assert port.startswith("127.0.0.1:"), (name, port)


def test_workers_drain_and_cuda_reserves_a_gpu(compose):
    for name, queue in (("worker-cpu", "cpu"), ("worker-cuda", "cuda")):
        svc = compose["services"][name]
        assert _seconds(svc["stop_grace_period"]) >= HARD_TIME_LIMIT_S
        assert svc.get("stop_signal", "SIGTERM") == "SIGTERM"
        assert svc["environment"]["TORCHFARM_TARGETS"] == queue
        assert "TORCHFARM_QUEUES" not in svc["environment"]
        assert svc["environment"]["PROMETHEUS_MULTIPROC_DIR"]
    (device,) = compose["services"]["worker-cuda"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
    assert "deploy" not in compose["services"]["worker-cpu"]


def test_prometheus_scrapes_the_ports_the_services_serve(compose):
    prom = yaml.safe_load((ROOT / "ops/prometheus/prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    coord = jobs["torchfarm-coordinator"]["dns_sd_configs"][0]
    assert coord["names"] == ["coordinator"]
    assert str(coord["port"]) == compose["services"]["coordinator"]["environment"]["TORCHFARM_METRICS_PORT"]
    workers = jobs["torchfarm-worker"]["dns_sd_configs"][0]
    assert set(workers["names"]) == {"worker-cpu", "worker-cuda"}
    for name in workers["names"]:
        assert str(workers["port"]) == compose["services"][name]["environment"]["TORCHFARM_METRICS_PORT"]


def test_bind_mounts_and_build_files_exist(compose):
    for name, svc in compose["services"].items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: {source}"
        if "build" in svc:
            assert (ROOT / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()


@pytest.mark.parametrize("dockerfile", sorted(p.name for p in (ROOT / "docker").glob("*.Dockerfile")))
def test_dockerfile_copies_existing_files_and_runs_existing_code(dockerfile):
    text = (ROOT / "docker" / dockerfile).read_text()
    assert re.search(r"^FROM \S+:\S+", text, re.M), "pin the base image's tag"
    for line in re.findall(r"^COPY (?!--from=)(.+)$", text, re.M):
        *sources, _ = [a for a in line.split() if not a.startswith("--chown=")]
        for src in sources:
            assert (ROOT / src).exists(), f"{dockerfile}: COPY {src}"
    assert re.search(r"^USER (?!0\b|root\b)", text, re.M), "run as a non-root user"
    assert "-Q" not in text, "a worker's queues follow from TORCHFARM_TARGETS"
    cmd = re.search(r"^CMD (.+)$", text, re.M).group(1)
    module = re.search(r"(?:-m|-A)\W+([\w.]+)", cmd)
    if module is None:  # the client image runs an example script
        script = re.search(r'"([\w/]+\.py)"', cmd).group(1)
        assert (ROOT / script).is_file(), cmd
    else:
        assert (ROOT / (module.group(1).replace(".", "/") + ".py")).is_file(), cmd


def test_dockerignore_keeps_the_virtualenv_out():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="the docker compose plugin is not installed (validated with the schema instead)",
)
def test_docker_compose_config_accepts_the_file():
    out = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "--profile", "cuda", "config", "--quiet"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr


def test_the_deploy_tests_override_stays_on_loopback(compose):
    """tests/deploy/compose.test.yml (make test-deploy): host networking, every listener
    on 127.0.0.1, and only services of the real file."""
    override = yaml.safe_load((ROOT / "tests/deploy/compose.test.yml").read_text())
    assert set(override["services"]) <= set(compose["services"])
    for name, svc in override["services"].items():
        if name == "init":
            continue
        assert svc["network_mode"] == "host", name
    assert _flags(override["services"]["redis-broker"]["command"])["--bind"] == "127.0.0.1"
    assert _flags(override["services"]["redis-cache"]["command"])["--bind"] == "127.0.0.1"
    assert _flags(override["services"]["redis-state"]["command"])["--bind"] == "127.0.0.1"
    assert override["services"]["coordinator"]["environment"]["TORCHFARM_LISTEN"].startswith("127.0.0.1:")
