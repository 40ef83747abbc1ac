"""The Kubernetes manifests, offline: composition, schemas, and the properties the farm
relies on (drain, GPUs, autoscaling, probes, scraping). No cluster is involved.

Core objects are validated with kubernetes-validate (strict: unknown fields fail),
KEDA's ScaledObjects with tests/schemas/keda-scaledobject.json.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.ops.promql import ROOT
from torchfarm.celeryconf import HARD_TIME_LIMIT_S

K8S = ROOT / "k8s"
KUBERNETES_VERSION = "1.31.0"
"""The oldest Kubernetes the manifests target (native gRPC probes are GA since 1.27)."""

KEDA_SCHEMA = json.loads((ROOT / "tests/schemas/keda-scaledobject.json").read_text())
WORKER_QUEUES = ("cpu", "cuda", "rocm")


def _kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def _compose(secrets_root) -> list[dict]:
    """What `kubectl kustomize k8s` renders, for this kustomization's features: the
    listed resources, in the kustomization's namespace, with its labels and images, and
    the Secrets its secretGenerator makes from files (`secrets/...`, read under
    `secrets_root`, where torchfarm.trust.provision wrote them)."""
    kz = _kustomization()
    tags = {i["name"]: i["newTag"] for i in kz.get("images", [])}
    docs = []
    for res in kz["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / res).read_text()) if d]
    assert kz["generatorOptions"]["disableNameSuffixHash"] is True, "names are referred to as is"
    for gen in kz.get("secretGenerator", []):
        data = {}
        for entry in gen["files"]:
            key, _, path = entry.partition("=")
            data[key] = base64.b64encode((secrets_root / path.removeprefix("secrets/")).read_bytes()).decode()
        docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": gen["name"]},
                     "type": gen.get("type", "Opaque"), "data": data})
    for d in docs:
        if d["kind"] != "Namespace":
            d["metadata"]["namespace"] = kz["namespace"]
        for pairs in kz.get("labels", []):
            d["metadata"].setdefault("labels", {}).update(pairs["pairs"])
        for c in _containers(d):
            if c["image"] in tags:
                c["image"] = f"{c['image']}:{tags[c['image']]}"
    return docs


def _provision(out):
    from torchfarm.trust import provision

    provision.provision(out, tenant="team-a", hosts=["coordinator", "coordinator.torchfarm.svc"],
                        broker="redis-broker:6379", cache="redis-cache:6379", state="redis-state:6379")
    return out


def _containers(d: dict) -> list[dict]:
    spec = d.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", [])


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> list[dict]:
    return _compose(_provision(tmp_path_factory.mktemp("k8s-secrets")))


WORKLOADS = ("Deployment", "StatefulSet")


def _one(docs, kind: str, name: str) -> dict:
    (d,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return d


def test_kustomization_lists_every_manifest_and_only_existing_ones():
    listed = set(_kustomization()["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_renders_the_same_objects(docs, tmp_path):
    shutil.copytree(K8S, tmp_path / "k8s", ignore=shutil.ignore_patterns("secrets"))
    _provision(tmp_path / "k8s" / "secrets")
    out = subprocess.run(["kubectl", "kustomize", str(tmp_path / "k8s")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    key = lambda d: (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, rendered)) == sorted(map(key, docs))
    images = {c["image"] for d in rendered for c in _containers(d)}
    assert images == {c["image"] for d in docs for c in _containers(d)}
    for d in rendered:
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "torchfarm"


def test_core_objects_are_valid_kubernetes(docs):
    core = [d for d in docs if not d["apiVersion"].startswith(("keda.sh/", "monitoring.coreos.com/"))]
    assert {d["kind"] for d in core} >= {"Namespace", "ConfigMap", "Secret", "Deployment",
                                          "StatefulSet", "Service", "PodDisruptionBudget",
                                          "NetworkPolicy"}
    for d in core:
        kubernetes_validate.validate(d, KUBERNETES_VERSION, strict=True)


def test_kubernetes_validate_catches_a_typo(docs):
    bad = json.loads(json.dumps(_one(docs, "Deployment", "worker-cpu")))
    bad["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 660
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_scaled_objects_match_the_keda_schema(docs):
    jsonschema.Draft202012Validator.check_schema(KEDA_SCHEMA)
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    assert len(scaled) == len(WORKER_QUEUES)
    for d in scaled:
        jsonschema.validate(d, KEDA_SCHEMA, cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize("mutate", [
    lambda s: s["spec"].pop("triggers"),
    lambda s: s["spec"].update(maxReplicaCount="ten"),
    lambda s: s["spec"]["triggers"][0]["metadata"].pop("query"),
    lambda s: s["spec"]["triggers"][0]["metadata"].update(threshold=1),
    lambda s: s["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    .update(stabilizationWindowSeconds=7200),
    lambda s: s["spec"].update(scaleTargetRefs={"name": "x"}),
], ids=["no-triggers", "string-max", "no-query", "number-threshold", "window-too-long", "typo"])
def test_keda_schema_rejects_broken_objects(docs, mutate):
    bad = json.loads(json.dumps(_one(docs, "ScaledObject", "worker-cpu")))
    mutate(bad)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, KEDA_SCHEMA, cls=jsonschema.Draft202012Validator)


def test_coordinator_is_highly_available_and_probed(docs):
    dep = _one(docs, "Deployment", "coordinator")
    assert dep["spec"]["replicas"] >= 2
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    # TLS only on the gRPC port, which Kubernetes' gRPC probes cannot speak: readiness
    # asks the health service on the plaintext health port, which goes NOT_SERVING while
    # Redis is unreachable (tests/ops/test_readiness.py); /metrics answers regardless.
    assert "httpGet" not in c["readinessProbe"]
    assert c["readinessProbe"]["grpc"]["port"] == int(_env(c)["TORCHFARM_HEALTH_PORT"])
    assert c["readinessProbe"]["grpc"]["service"] == "torchfarm.v1.CompileFarm"
    assert c["livenessProbe"]["tcpSocket"]["port"] == "grpc"
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    pdb = _one(docs, "PodDisruptionBudget", "coordinator")
    assert pdb["spec"]["minAvailable"] >= 1
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    svc = _one(docs, "Service", "coordinator")
    assert svc["spec"]["selector"].items() <= pod_labels.items()


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _secret_file(docs, workload: dict, path: str) -> bytes:
    """The bytes a container reads at `path`, from the Secret volume mounted above it."""
    spec = workload["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in spec["containers"][0]["volumeMounts"]:
        if path.startswith(mount["mountPath"] + "/") and "secret" in volumes[mount["name"]]:
            assert mount.get("readOnly") is True
            secret = _one(docs, "Secret", volumes[mount["name"]]["secret"]["secretName"])
            return base64.b64decode(secret["data"][path.removeprefix(mount["mountPath"] + "/")])
    raise AssertionError(f"nothing mounted at {path}")


def test_the_coordinator_requires_tokens_and_tls_and_reads_redis_urls_from_secrets(docs):
    dep = _one(docs, "Deployment", "coordinator")
    env = _env(dep["spec"]["template"]["spec"]["containers"][0])
    tokens = json.loads(_secret_file(docs, dep, env["TORCHFARM_TOKENS_FILE"]))
    assert tokens, "an empty token table would leave the farm open"
    cert = _secret_file(docs, dep, env["TORCHFARM_TLS_CERT_FILE"])
    assert b"BEGIN CERTIFICATE" in cert and b"PRIVATE KEY" in _secret_file(docs, dep, env["TORCHFARM_TLS_KEY_FILE"])
    assert _one(docs, "Secret", "torchfarm-tls")["type"] == "kubernetes.io/tls"
    assert json.loads(_secret_file(docs, dep, env["TORCHFARM_TRUSTED_KEYS_FILE"]))
    url = _secret_file(docs, dep, env["TORCHFARM_BROKER_URL_FILE"]).decode()
    assert url.startswith("redis://coordinator:") and "@redis-broker:6379/" in url
    assert not {"TORCHFARM_BROKER_URL", "TORCHFARM_CACHE_URL", "TORCHFARM_STATE_URL"} & set(env)
    state = _secret_file(docs, dep, env["TORCHFARM_STATE_URL_FILE"]).decode()
    assert state.startswith("redis://coordinator:") and "@redis-state:6379/" in state


@pytest.mark.parametrize("queue", WORKER_QUEUES)
def test_workers_sign_and_read_their_own_roles_urls(docs, queue):
    dep = _one(docs, "Deployment", f"worker-{queue}")
    env = _env(dep["spec"]["template"]["spec"]["containers"][0])
    assert b"PRIVATE KEY" in _secret_file(docs, dep, env["TORCHFARM_SIGNING_KEY_FILE"])
    url = _secret_file(docs, dep, env["TORCHFARM_CACHE_URL_FILE"]).decode()
    assert url.startswith("redis://worker:") and "@redis-cache:6379/" in url
    state = _secret_file(docs, dep, env["TORCHFARM_STATE_URL_FILE"]).decode()
    assert state.startswith("redis://worker:") and "@redis-state:6379/" in state
    assert state.split("@")[0] != url.split("@")[0], "the state Redis has passwords of its own"
    assert not env["TMPDIR"].startswith("/tmp")


def test_no_password_or_placeholder_sits_in_the_manifests():
    for path in K8S.glob("*.yaml"):
        text = path.read_text()
        assert "change-me" not in text and "REDIS_PASSWORD" not in text, path.name
        assert not re.search(r"redis://[^\s\"]*@", text), path.name


def test_only_the_coordinator_and_workers_reach_redis(docs):
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    labels = lambda d: d["spec"]["template"]["metadata"]["labels"]  # noqa: E731
    def selects(selector, pod_labels):
        return all(pod_labels.get(e["key"]) in e["values"] for e in selector["matchExpressions"])
    for name in ("redis-broker", "redis-cache", "redis-state"):
        (redis,) = [d for d in docs if d["kind"] in WORKLOADS and d["metadata"]["name"] == name]
        assert selects(policy["spec"]["podSelector"], labels(redis)), name
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    (source,) = rule["from"]
    allowed = {d["metadata"]["name"] for d in docs if d["kind"] in WORKLOADS
               and selects(source["podSelector"], labels(d))}
    assert allowed == {"coordinator", "worker-cpu", "worker-cuda", "worker-rocm"}
    assert "namespaceSelector" not in source, "pods of this namespace only"


def test_redis_users_come_from_the_secrets_acl(docs):
    for kind, name, _acl in (("StatefulSet", "redis-broker", "broker.acl"), ("Deployment", "redis-cache", "cache.acl"),
                             ("StatefulSet", "redis-state", "state.acl")):
        workload = _one(docs, kind, name)
        args = workload["spec"]["template"]["spec"]["containers"][0]["args"]
        text = _secret_file(docs, workload, args[args.index("--aclfile") + 1]).decode()
        assert text.startswith("user default on nopass -@all +ping\n")
        assert "user coordinator on >" in text and "user worker on >" in text


@pytest.mark.parametrize("queue", WORKER_QUEUES)
def test_worker_drains_within_its_grace_period(docs, queue):
    spec = _one(docs, "Deployment", f"worker-{queue}")["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] >= HARD_TIME_LIMIT_S
    (c,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    # The pod serves its own machine's target; the queues follow (workers/serving.py), so
    # neither -Q nor TORCHFARM_QUEUES may pin another one.
    assert env["TORCHFARM_TARGETS"] == queue
    assert "-Q" not in c["command"] and "TORCHFARM_QUEUES" not in env
    assert env["PROMETHEUS_MULTIPROC_DIR"] and env["TORCHFARM_METRICS_PORT"] == "9101"
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])


def test_gpu_workers_ask_for_gpus_and_run_on_gpu_nodes(docs):
    for queue, resource in (("cuda", "nvidia.com/gpu"), ("rocm", "amd.com/gpu")):
        spec = _one(docs, "Deployment", f"worker-{queue}")["spec"]["template"]["spec"]
        assert spec["containers"][0]["resources"]["limits"][resource] == 1
        (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        (expr,) = term["matchExpressions"]
        assert expr["operator"] == "In" and expr["values"] == ["true"] and "gpu" in expr["key"]
        assert any(t["key"] == resource for t in spec["tolerations"])
    cpu = _one(docs, "Deployment", "worker-cpu")["spec"]["template"]["spec"]
    assert not {"nvidia.com/gpu", "amd.com/gpu"} & set(cpu["containers"][0]["resources"].get("limits", {}))


@pytest.mark.parametrize("queue", WORKER_QUEUES)
def test_keda_scales_each_worker_on_queued_plus_in_flight(docs, queue):
    so = _one(docs, "ScaledObject", f"worker-{queue}")
    assert so["spec"]["scaleTargetRef"]["name"] == f"worker-{queue}"
    _one(docs, "Deployment", so["spec"]["scaleTargetRef"]["name"])
    triggers = {t["name"]: t for t in so["spec"]["triggers"]}
    assert set(triggers) == {"graph-jobs", "kernel-build-jobs"}
    for name, kinds in (("graph-jobs", "graph"), ("kernel-build-jobs", "stage|kernel")):
        trigger = triggers[name]
        assert trigger["type"] == "prometheus"
        # An empty or failed query is a failure (fallback replicas), never a 0.
        assert trigger["metadata"]["ignoreNullValues"] == "false"
        query = " ".join(trigger["metadata"]["query"].split())
        # The one label scheme (torchfarm/metric_labels.py): targets as "cpu:avx512".
        selector = f'{{target=~"{queue}(:.*)?", kind=~"{kinds}"}}'
        by = "max by (target, kind, build)"
        assert f"sum({by} (torchfarm_queue_depth{selector}))" in query
        assert f"sum({by} (torchfarm_jobs_in_flight{selector}))" in query
        assert ") + (" in query, "queued PLUS in flight"
        # Every coordinator exports the same gauges: max() across replicas before any sum.
        assert "sum(torchfarm_" not in query
    # A graph compile holds a worker for its whole length; kernel builds take seconds:
    # one pod per graph job, one per many kernel-build jobs.
    assert float(triggers["graph-jobs"]["metadata"]["threshold"]) == 1
    assert float(triggers["kernel-build-jobs"]["metadata"]["threshold"]) >= 8
    behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
    assert so["spec"]["fallback"]["replicas"] >= 1


def test_gpu_pools_scale_from_zero(docs):
    """A queued job wakes a pool at zero: the coordinator queues for known targets even
    with no live worker (services/coordinator/farm.py), and activation is at > 0."""
    for queue in ("cuda", "rocm"):
        so = _one(docs, "ScaledObject", f"worker-{queue}")
        assert so["spec"]["minReplicaCount"] == 0
        assert all(t["metadata"]["activationThreshold"] == "0" for t in so["spec"]["triggers"])


def test_pods_that_export_metrics_are_annotated_for_scraping(docs):
    for name in ("coordinator", *(f"worker-{q}" for q in WORKER_QUEUES)):
        tmpl = _one(docs, "Deployment", name)["spec"]["template"]
        ann = tmpl["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"
        ports = {p["containerPort"] for p in tmpl["spec"]["containers"][0]["ports"]}
        assert int(ann["prometheus.io/port"]) in ports
        # The scrape job names itself after this label; alerts.yml selects on it.
        assert tmpl["metadata"]["labels"]["app.kubernetes.io/name"] in {
            "torchfarm-coordinator", "torchfarm-worker"}


@pytest.mark.parametrize("name", ["redis-broker", "redis-state"])
def test_the_broker_and_the_state_are_stateful_sets_on_their_own_volumes(docs, name):
    sts = _one(docs, "StatefulSet", name)
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/data"
    assert claim["spec"]["resources"]["requests"]["storage"]
    svc = _one(docs, "Service", sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None"
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"


def test_broker_and_state_never_evict_and_cache_evicts_lru(docs):
    broker = _one(docs, "StatefulSet", "redis-broker")["spec"]["template"]["spec"]["containers"][0]
    state = _one(docs, "StatefulSet", "redis-state")["spec"]["template"]["spec"]["containers"][0]
    cache = _one(docs, "Deployment", "redis-cache")["spec"]["template"]["spec"]["containers"][0]
    b, c = broker["args"], cache["args"]
    assert b[b.index("--maxmemory-policy") + 1] == "noeviction"
    s = state["args"]
    assert s[s.index("--maxmemory-policy") + 1] == "noeviction"
    assert c[c.index("--maxmemory-policy") + 1] == "allkeys-lru"
    assert c[c.index("--maxmemory") + 1]


def test_every_referenced_config_and_secret_exists(docs):
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for d in docs:
        for c in _containers(d):
            for src in c.get("envFrom", []):
                assert ("ConfigMap", src["configMapRef"]["name"]) in names
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    secret = _one(docs, "Secret", ref["name"])
                    assert ref["key"] in secret.get("stringData", {}) | secret.get("data", {})
        for v in d.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", []):
            if "secret" in v:
                assert ("Secret", v["secret"]["secretName"]) in names


def test_services_select_existing_pods(docs):
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] in WORKLOADS]
    for svc in (d for d in docs if d["kind"] == "Service"):
        assert any(svc["spec"]["selector"].items() <= p.items() for p in pods), svc["metadata"]["name"]


def test_every_torchfarm_image_has_a_dockerfile(docs):
    for d in docs:
        for c in _containers(d):
            repo, _, tag = c["image"].partition(":")
            assert tag, f"{c['image']}: pin a tag"
            if repo.startswith("torchfarm/"):
                assert (ROOT / "docker" / f"{repo.removeprefix('torchfarm/')}.Dockerfile").is_file()


def test_pod_monitors_scrape_every_pod_keda_and_the_alerts_count_on(docs):
    """KEDA queries the Prometheus Operator's Prometheus; PodMonitors are how it finds
    the pods. Each selects pods by labels they carry, on a port they name, and labels
    the job as alerts.yml and the dashboard select it."""
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodMonitor"}
    assert set(monitors) == {"torchfarm-coordinator", "torchfarm-worker"}
    workloads = [d for d in docs if d["kind"] == "Deployment"
                 and d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name", "").startswith("torchfarm-")]
    for m in monitors.values():
        assert m["apiVersion"] == "monitoring.coreos.com/v1"
        assert m["metadata"]["namespace"] == "torchfarm"
        assert m["spec"]["jobLabel"] == "app.kubernetes.io/name"
        (endpoint,) = m["spec"]["podMetricsEndpoints"]
        assert endpoint["path"] == "/metrics"
        selected = [w for w in workloads if m["spec"]["selector"]["matchLabels"].items()
                    <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert selected, m["metadata"]["name"]
        for w in selected:
            ports = {p["name"] for p in w["spec"]["template"]["spec"]["containers"][0]["ports"]}
            assert endpoint["port"] in ports, w["metadata"]["name"]
            assert w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == m["metadata"]["name"]
    # Every Deployment that exports metrics is monitored: the coordinator and all pools.
    assert {w["metadata"]["name"] for w in workloads} == {"coordinator", *(f"worker-{q}" for q in WORKER_QUEUES)}
    for so in (d for d in docs if d["kind"] == "ScaledObject"):
        for t in so["spec"]["triggers"]:
            assert "prometheus-operated" in t["metadata"]["serverAddress"]
