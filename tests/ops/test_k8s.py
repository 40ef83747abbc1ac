"""The Kubernetes manifests, offline: composition, schemas, and the properties the farm
relies on (drain, GPUs, autoscaling, probes, scraping). No cluster is involved.

Core objects are validated with kubernetes-validate (strict: unknown fields fail),
KEDA's ScaledObjects with tests/schemas/keda-scaledobject.json.
"""

from __future__ import annotations

import json
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


def _compose() -> list[dict]:
    """What `kubectl kustomize k8s` renders, for this kustomization's features: the
    listed resources, in the kustomization's namespace, with its labels and images."""
    kz = _kustomization()
    tags = {i["name"]: i["newTag"] for i in kz.get("images", [])}
    docs = []
    for res in kz["resources"]:
        for d in yaml.safe_load_all((K8S / res).read_text()):
            if not d:
                continue
            if d["kind"] != "Namespace":
                d["metadata"]["namespace"] = kz["namespace"]
            for pairs in kz.get("labels", []):
                d["metadata"].setdefault("labels", {}).update(pairs["pairs"])
            for c in _containers(d):
                if c["image"] in tags:
                    c["image"] = f"{c['image']}:{tags[c['image']]}"
            docs.append(d)
    return docs


def _containers(d: dict) -> list[dict]:
    spec = d.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", [])


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return _compose()


def _one(docs, kind: str, name: str) -> dict:
    (d,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return d


def test_kustomization_lists_every_manifest_and_only_existing_ones():
    listed = set(_kustomization()["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_renders_the_same_objects(docs):
    out = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
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
    core = [d for d in docs if not d["apiVersion"].startswith("keda.sh/")]
    assert {d["kind"] for d in core} >= {"Namespace", "ConfigMap", "Secret", "Deployment",
                                          "Service", "PodDisruptionBudget"}
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


def test_coordinator_is_highly_available_and_probed_natively(docs):
    dep = _one(docs, "Deployment", "coordinator")
    assert dep["spec"]["replicas"] >= 2
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["grpc"] == {"port": 50051, "service": "torchfarm.v1.CompileFarm"}
    assert c["livenessProbe"]["grpc"]["port"] == 50051
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    pdb = _one(docs, "PodDisruptionBudget", "coordinator")
    assert pdb["spec"]["minAvailable"] >= 1
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    svc = _one(docs, "Service", "coordinator")
    assert svc["spec"]["selector"].items() <= pod_labels.items()


def test_the_grpc_probe_names_the_service_the_coordinator_registers(docs):
    from services.coordinator.server import SERVICE_NAME

    c = _one(docs, "Deployment", "coordinator")["spec"]["template"]["spec"]["containers"][0]
    assert c["readinessProbe"]["grpc"]["service"] == SERVICE_NAME


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
        assert spec["nodeSelector"]
        assert any(t["key"] == resource for t in spec["tolerations"])
    cpu = _one(docs, "Deployment", "worker-cpu")["spec"]["template"]["spec"]
    assert not {"nvidia.com/gpu", "amd.com/gpu"} & set(cpu["containers"][0]["resources"].get("limits", {}))


@pytest.mark.parametrize("queue", WORKER_QUEUES)
def test_keda_scales_each_worker_on_queued_plus_in_flight(docs, queue):
    so = _one(docs, "ScaledObject", f"worker-{queue}")
    assert so["spec"]["scaleTargetRef"]["name"] == f"worker-{queue}"
    _one(docs, "Deployment", so["spec"]["scaleTargetRef"]["name"])
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    query = " ".join(trigger["metadata"]["query"].split())
    selector = f'{{device="{queue}"}}'
    assert f"sum(max by (queue) (torchfarm_queue_depth{selector}))" in query
    assert f"sum(max by (queue) (torchfarm_jobs_in_flight{selector}))" in query
    assert ") + (" in query, "queued PLUS in flight"
    # Every coordinator exports the same gauges: max() across replicas before any sum.
    assert "sum(torchfarm_" not in query
    behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
    assert so["spec"]["minReplicaCount"] >= 1  # see keda.yaml: a pool at zero never wakes


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


def test_broker_never_evicts_and_cache_evicts_lru(docs):
    broker = _one(docs, "Deployment", "redis-broker")["spec"]["template"]["spec"]["containers"][0]
    cache = _one(docs, "Deployment", "redis-cache")["spec"]["template"]["spec"]["containers"][0]
    b, c = broker["args"], cache["args"]
    assert b[b.index("--maxmemory-policy") + 1] == "noeviction"
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


def test_services_select_existing_pods(docs):
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] == "Deployment"]
    for svc in (d for d in docs if d["kind"] == "Service"):
        assert any(svc["spec"]["selector"].items() <= p.items() for p in pods), svc["metadata"]["name"]


def test_every_torchfarm_image_has_a_dockerfile(docs):
    for d in docs:
        for c in _containers(d):
            repo, _, tag = c["image"].partition(":")
            assert tag, f"{c['image']}: pin a tag"
            if repo.startswith("torchfarm/"):
                assert (ROOT / "docker" / f"{repo.removeprefix('torchfarm/')}.Dockerfile").is_file()
