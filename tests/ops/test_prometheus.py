"""A real Prometheus scrapes a real farm through a compile; then every query of the
dashboard and every alert rule must work against what it scraped.

One module-scoped scenario (about a minute on two cores):

1. a LocalStack with metrics on (coordinator on P, worker on P+1);
2. `prometheus` scraping both every second, with ops/prometheus/alerts.yml loaded;
3. through the farm: one real compile of examples.models.make_mlp() with
   `sdk.compile(..., fallback="error")`, compared with eager; one job the worker refuses
   (BUILD_MISMATCH); one GetJob for a key that does not exist (NOT_FOUND);
4. the checks below, through Prometheus' HTTP API: the dashboard's queries, the alert
   rules and KEDA's scaling queries (k8s/keda.yaml) all run on what was scraped.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

import grpc
import pytest
import yaml

from localfarm.stack import LocalStack, free_port
from tests.conftest import run_python
from tests.ops.farm import MLP_COMPILE_SCRIPT, queue_foreign_build_job, wait_for
from tests.ops.promql import ALERTS, alert_rules, all_selectors, dashboard_queries, keda_queries
from torchfarm import metric_labels
from torchfarm.v1 import farm_pb2, farm_pb2_grpc
from torchfarm.wire.codes import JobError

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="prometheus is not installed (apt-get install prometheus, or WITH_PROMETHEUS=1 ./scripts/setup.sh)",
    ),
    pytest.mark.timeout(300),
]


def _free_pair() -> int:
    """A port P with P+1 free too: the coordinator's and the worker's metrics ports."""
    for _ in range(50):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise RuntimeError("no two adjacent free ports")


class Prom:
    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params: str) -> dict:
        q = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{q}", timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # 400 on a bad query, with the error in the body
            body = json.load(e)
        return body

    def query(self, expr: str) -> list[dict]:
        body = self.get("/api/v1/query", query=expr)
        assert body["status"] == "success", f"{expr}\n→ {body.get('errorType')}: {body.get('error')}"
        return body["data"]["result"]


def _refused_job_and_missing_key(stack: LocalStack) -> None:
    """A job the worker refuses (another torch build) and a lookup of an unknown key."""
    with grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as ch:
        stub = farm_pb2_grpc.CompileFarmStub(ch)
        key = queue_foreign_build_job(stack.store(), stack.broker_url, "other")
        job = wait_for(
            "the refused job to fail",
            lambda: (j := stub.GetJob(farm_pb2.JobRef(key=key), timeout=10)).state
            == farm_pb2.FAILED and j,
        )
        assert job.error_code == "BUILD_MISMATCH"
        with pytest.raises(grpc.RpcError) as e:
            stub.GetJob(farm_pb2.JobRef(key="0" * 64), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    workdir: Path = tmp_path_factory.mktemp("prom")
    metrics_port = _free_pair()
    with LocalStack(
        workers=1, metrics_port=metrics_port, workdir=workdir / "stack", warmup=False
    ) as stack:
        prom_port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {"job_name": "torchfarm-coordinator",
                 "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]},
                {"job_name": "torchfarm-worker",
                 "static_configs": [{"targets": [f"127.0.0.1:{stack.worker_metrics_port(0)}"]}]},
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        log = open(workdir / "prometheus.log", "wb")
        proc = subprocess.Popen(
            ["prometheus", f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        log.close()
        try:
            p = Prom(f"http://127.0.0.1:{prom_port}")
            wait_for("prometheus to be ready", lambda: _ready(p.url), timeout_s=30)
            wait_for("both targets up", lambda: len(p.query("up == 1")) == 2)

            out = run_python(MLP_COMPILE_SCRIPT.format(address=stack.address), stack.client_env(), timeout=600)
            assert out.returncode == 0 and "COMPILED-OK" in out.stdout, out.stderr[-4000:]
            _refused_job_and_missing_key(stack)

            # The compile's samples, then a few more scrapes so that rates have two points.
            wait_for("the compile's samples", lambda: p.query(
                'torchfarm_compile_duration_seconds_count{stage="total"} > 0'
                ' and on() torchfarm_worker_jobs_total{outcome="failed"} > 0'), timeout_s=60)
            time.sleep(4)
            # Rules are evaluated every second; wait for one evaluation after the compile.
            t = time.time()
            wait_for("a rule evaluation", lambda: _evaluated_after(p, t), timeout_s=30)
            yield p
        finally:
            proc.terminate()
            proc.wait(30)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _evaluated_after(p: Prom, t: float) -> bool:
    groups = p.get("/api/v1/rules")["data"]["groups"]
    return bool(groups) and all(_epoch(g["lastEvaluation"]) > t for g in groups)


def _epoch(ts: str) -> float:
    """Prometheus' RFC 3339 times carry nanoseconds, more than datetime parses."""
    m = re.fullmatch(r"(.+T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", ts)
    assert m, ts
    whole = datetime.fromisoformat(m.group(1) + m.group(3).replace("Z", "+00:00"))
    return whole.timestamp() + float(m.group(2) or 0)


def test_both_targets_scraped(prom):
    targets = prom.get("/api/v1/targets")["data"]["activeTargets"]
    assert {t["labels"]["job"]: t["health"] for t in targets} == {
        "torchfarm-coordinator": "up", "torchfarm-worker": "up"}


def test_the_compile_shows_in_the_metrics(prom):
    def one(expr: str) -> float:
        (sample,) = prom.query(expr)
        return float(sample["value"][1])

    assert one('sum(torchfarm_requests_total{outcome="miss"})') >= 1
    assert one('sum(torchfarm_compile_duration_seconds_count{stage="total", target=~"cpu.*"})') == 1
    assert one('sum(torchfarm_compile_duration_seconds_sum{stage="compile", target=~"cpu.*"})') > 0
    assert one('sum(torchfarm_worker_jobs_total{outcome="succeeded", target=~"cpu.*"})') == 1
    assert one('sum(torchfarm_worker_jobs_total{outcome="failed", code="BUILD_MISMATCH"})') == 1
    assert one('sum(torchfarm_artifact_bytes_count)') >= 1
    assert one('sum(torchfarm_rpc_errors_total{code="NOT_FOUND"})') >= 1
    assert one('sum(max by (target, kind, build) (torchfarm_workers{target=~"cpu:.*", kind="graph"}))') == 1
    assert one('max(torchfarm_backend_up)') == 1
    assert one('count(torchfarm_build_info)') == 2  # coordinator and worker


@pytest.mark.parametrize("title,expr", dashboard_queries(), ids=[t for t, _ in dashboard_queries()])
def test_dashboard_query_returns_data(prom, title, expr):
    assert prom.query(expr), f"panel {title!r} shows no data: {expr}"


@pytest.mark.parametrize("name,expr", keda_queries(), ids=[n for n, _ in keda_queries()])
def test_keda_scaling_query_returns_a_number(prom, name, expr):
    """KEDA's Prometheus scaler needs exactly one sample; an empty result is an error."""
    (sample,) = prom.query(expr)
    assert float(sample["value"][1]) >= 0, name


CLOSED_LABELS = {
    ("", "kind"): set(metric_labels.KINDS),
    ("torchfarm_worker_jobs_total", "code"): {str(code) for code in JobError} | {"", "OTHER"},
}
"""Labels whose values are a fixed set, of every metric ("") or of one: a value is
checked against the set, since a farm on this machine has no queue of every kind, and
fails no job with most job error codes (WORKER_FAULT is a bug), to match."""


def _closed(metric: str, label: str) -> set[str] | None:
    return CLOSED_LABELS.get((metric, label), CLOSED_LABELS.get(("", label)))


def test_every_selector_names_existing_series(prom):
    """No panel, rule or KEDA query points at a metric, label or label value that does
    not exist.

    An equality matcher must match a series, or for a closed label (CLOSED_LABELS) name
    one of its values; for a regex or negative matcher the label must exist on the
    metric (its values may legitimately not have occurred yet).
    """
    missing = []
    for where, sels in all_selectors().items():
        for s in sels:
            if not prom.query(f"count({s.metric})"):
                missing.append(f"{where}: metric {s.metric}")
                continue
            for label, op, value in s.matchers:
                closed = _closed(s.metric, label)
                if op == "=" and closed is not None:
                    ok = value in closed and prom.query(f'count({s.metric}{{{label}!=""}})')
                elif op == "=":
                    ok = prom.query(f'count({s.metric}{{{label}="{value}"}})')
                else:
                    ok = prom.query(f'count({s.metric}{{{label}!=""}})')
                if not ok:
                    missing.append(f"{where}: {s.metric}{{{label}{op}\"{value}\"}}")
    assert not missing, "\n".join(missing)


def test_alert_rules_load_and_evaluate(prom):
    groups = prom.get("/api/v1/rules")["data"]["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(rules) == {r["alert"] for r in alert_rules()}
    for name, r in rules.items():
        assert r["health"] == "ok", f"{name}: {r.get('lastError')}"


@pytest.mark.parametrize("name", [r["alert"] for r in alert_rules()])
def test_alert_expression_runs(prom, name):
    (rule,) = [r for r in alert_rules() if r["alert"] == name]
    prom.query(rule["expr"])  # parses and evaluates; a healthy farm fires nothing


def test_healthy_farm_alerts_nothing(prom):
    """After a good compile, no alert expression is true: none pending, none firing."""
    alerts = prom.get("/api/v1/alerts")["data"]["alerts"]
    assert not alerts, alerts
