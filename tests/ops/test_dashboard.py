"""The Grafana dashboard and its provisioning files, offline (Grafana is not installed
here; test_prometheus.py runs every query against a real Prometheus)."""

from __future__ import annotations

import json

import yaml

from tests.ops.promql import DASHBOARD, ROOT, all_selectors, dashboard_queries, selectors

PROVISIONING = ROOT / "ops/grafana/provisioning"


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_dashboard_has_the_panels_operators_need():
    titles = " | ".join(p["title"].lower() for p in _dashboard()["panels"])
    for needed in ("hit ratio", "compile time by stage (p50, p95)", "queue depth and in flight",
                   "workers per target", "errors by code", "artifact bytes",
                   "refused artifacts and authentication failures", "misses by reason",
                   "client wait: submit, watch, fetch", "job failures by target"):
        assert needed in titles, f"no panel for {needed!r}"


def test_compile_time_panel_shows_p50_and_p95_by_stage():
    queries = [q for t, q in dashboard_queries() if t.startswith("Compile time by stage")]
    assert any(q.startswith("histogram_quantile(0.5,") and "by (le, stage)" in q for q in queries)
    assert any(q.startswith("histogram_quantile(0.95,") and "by (le, stage)" in q for q in queries)


def test_panels_are_well_formed():
    dash = _dashboard()
    assert dash["uid"] == "torchfarm" and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        assert p["type"] in {"timeseries", "stat", "table"}
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        mine = {(g["x"] + dx, g["y"] + dy) for dx in range(g["w"]) for dy in range(g["h"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"] == p["datasource"]


def test_queries_aggregate_farm_gauges_with_max():
    """Every coordinator replica exports the same farm-wide gauges: summing them would
    count each queue once per replica."""
    for title, q in dashboard_queries():
        for gauge in ("torchfarm_queue_depth", "torchfarm_jobs_in_flight", "torchfarm_workers"):
            if gauge in q:
                assert f"max by (target, kind, build) ({gauge})" in q, f"{title}: {q}"


def test_queries_label_targets_one_way():
    """Targets are `target="cpu:avx512"` everywhere (torchfarm/metric_labels.py): no
    query groups or selects by the queue's name or a `device` label."""
    for where, sels in all_selectors().items():
        for s in sels:
            assert not {label for label, _, _ in s.matchers} & {"queue", "device"}, where
    for title, q in dashboard_queries():
        assert "(queue)" not in q and "queue," not in q and "device" not in q, f"{title}: {q}"


def test_no_query_uses_a_high_cardinality_label():
    for where, sels in all_selectors().items():
        for s in sels:
            for label, _, _ in s.matchers:
                assert label not in {"key", "job_id", "worker"}, where


def test_selector_scanner():
    sels = selectors('sum by (code) (rate(torchfarm_rpcs_total{code=~"A|up"}[5m])) / sum(up{job="x"})')
    assert [(s.metric, s.matchers) for s in sels] == [
        ("torchfarm_rpcs_total", (("code", "=~", "A|up"),)),
        ("up", (("job", "=", "x"),)),
    ]


def test_datasource_provisioning_matches_the_dashboard():
    doc = yaml.safe_load((PROVISIONING / "datasources/prometheus.yml").read_text())
    (ds,) = doc["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    var = next(v for v in _dashboard()["templating"]["list"] if v["name"] == "datasource")
    assert var["type"] == "datasource" and var["query"] == "prometheus"
    assert var["current"]["value"] == ds["uid"]


def test_dashboard_provider_reads_the_folder_compose_mounts():
    doc = yaml.safe_load((PROVISIONING / "dashboards/torchfarm.yml").read_text())
    (provider,) = doc["providers"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"] if v.startswith("./"))
    assert mounts["./ops/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./ops/grafana/provisioning"] == "/etc/grafana/provisioning"
