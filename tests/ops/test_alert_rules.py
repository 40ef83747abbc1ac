"""The alert rules and scrape configs, through Prometheus' own promtool (Debian's
`prometheus` package; ./scripts/setup.sh installs it with WITH_PROMETHEUS=1, as CI does)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.ops.promql import ROOT, alert_rules

OPS = ROOT / "ops/prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (apt-get install prometheus, or WITH_PROMETHEUS=1 ./scripts/setup.sh)",
)


def _promtool(*args: str, cwd=OPS) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_rules_check():
    out = _promtool("check", "rules", "alerts.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in out.stdout


@needs_promtool
def test_rules_unit_tests():
    out = _promtool("test", "rules", "alerts_test.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_unit_test():
    tested = {
        t["alertname"]
        for case in yaml.safe_load((OPS / "alerts_test.yml").read_text())["tests"]
        for t in case.get("alert_rule_test", [])
        if t.get("exp_alerts")
    }
    assert {r["alert"] for r in alert_rules()} <= tested


def test_the_alerts_the_issue_asks_for_exist():
    rules = {r["alert"]: r for r in alert_rules()}
    for name in ("TorchfarmCoordinatorDown", "TorchfarmQueueBacklogGrowing",
                 "TorchfarmErrorRatioHigh", "TorchfarmNoWorkerForQueuedJobs",
                 "TorchfarmCacheHitRatioCollapsed"):
        assert name in rules
        assert rules[name]["labels"]["severity"] in {"warning", "critical"}
        assert rules[name]["annotations"]["summary"]


# Each operations concern and the metric its alert reads.
CONCERNS = {
    "TorchfarmArtifactsRefused": "torchfarm_artifacts_refused_total",
    "TorchfarmAuthFailures": "torchfarm_auth_failures_total",
    "TorchfarmJobFailureRatioHigh": "torchfarm_worker_jobs_total",
    "TorchfarmEvictedMissesHigh": "torchfarm_misses_total",
    "TorchfarmSubmitSlow": "torchfarm_rpc_duration_seconds_bucket",
    "TorchfarmQueueWaitHigh": "torchfarm_job_queue_wait_seconds_bucket",
    "TorchfarmCompileSlow": "torchfarm_compile_duration_seconds_bucket",
}


def test_refusals_auth_job_failures_misses_and_latency_have_alerts():
    rules = {r["alert"]: r for r in alert_rules()}
    for name, metric in CONCERNS.items():
        assert name in rules, name
        assert metric in rules[name]["expr"], name
        assert rules[name]["labels"]["severity"] in {"warning", "critical"}


def test_alerts_label_targets_one_way():
    """Grouped by `target` (and the queue gauges' kind and build), never by a queue
    name or a device: torchfarm/metric_labels.py."""
    for r in alert_rules():
        assert "queue)" not in r["expr"] and "device" not in r["expr"], r["alert"]
        assert "$labels.queue" not in str(r["annotations"]), r["alert"]


@needs_promtool
def test_compose_scrape_config():
    out = _promtool("check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    jobs = {j["job_name"] for j in yaml.safe_load((OPS / "prometheus.yml").read_text())["scrape_configs"]}
    assert {"torchfarm-coordinator", "torchfarm-worker"} <= jobs


@needs_promtool
def test_kubernetes_scrape_config(tmp_path):
    """Debian builds Prometheus without Kubernetes discovery; where promtool rejects
    kubernetes_sd_configs for that reason, the rest of the config (the relabel rules
    that name the jobs) is checked with the discovery swapped for a file one."""
    out = _promtool("check", "config", "prometheus-k8s.yml")
    if out.returncode != 0 and "field kubernetes_sd_configs not found" in out.stdout + out.stderr:
        doc = yaml.safe_load((OPS / "prometheus-k8s.yml").read_text())
        for job in doc["scrape_configs"]:
            job.pop("kubernetes_sd_configs")
            job["file_sd_configs"] = [{"files": ["targets.json"]}]
        shutil.copy(OPS / "alerts.yml", tmp_path / "alerts.yml")
        (tmp_path / "prometheus-k8s.yml").write_text(yaml.safe_dump(doc))
        out = _promtool("check", "config", "prometheus-k8s.yml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    relabels = yaml.safe_load((OPS / "prometheus-k8s.yml").read_text())["scrape_configs"][0]["relabel_configs"]
    assert any(r.get("target_label") == "job" and
               r["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_name"]
               for r in relabels)
