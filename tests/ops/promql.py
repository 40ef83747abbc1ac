"""The PromQL the operations files carry: the dashboard's queries, the alert rules'
expressions, KEDA's scaling queries, and the metric selectors inside them.

Debian's Prometheus (2.42) has no parse_query endpoint, so selectors are found with a
small scanner. It knows the shape of this project's queries: every metric is named
`torchfarm_*` or `up`, matchers are `label op "value"`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "ops/grafana/dashboards/torchfarm.json"
ALERTS = ROOT / "ops/prometheus/alerts.yml"

GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
"""What Grafana would put in place of its variables, for Prometheus to run the query."""

_SELECTOR = re.compile(r"\b(torchfarm_[a-z0-9_]+|up)\b(?:\s*\{([^}]*)\})?")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value)


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, query) for every target of every panel, Grafana variables filled in."""
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(var, value)
            out.append((f"{panel['title']} [{target['refId']}]", expr))
    return out


def alert_rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def selectors(expr: str) -> list[Selector]:
    """The metric selectors of `expr` (label names after `by`/`without` are not metrics)."""
    found = []
    # Blank out strings first, so a matcher value never reads as a metric name.
    blanked = _STRING.sub(lambda m: '"' + "_" * (len(m.group()) - 2) + '"', expr)
    for m in _SELECTOR.finditer(blanked):
        body = expr[m.start(2) : m.end(2)] if m.group(2) is not None else ""
        found.append(Selector(m.group(1), tuple(_MATCHER.findall(body))))
    return found


def all_selectors() -> dict[str, list[Selector]]:
    """Where each query or rule comes from → its selectors."""
    out = {f"panel {title}": selectors(q) for title, q in dashboard_queries()}
    out.update({f"alert {r['alert']}": selectors(r["expr"]) for r in alert_rules()})
    out.update({f"keda {name}": selectors(q) for name, q in keda_queries()})
    return out


def keda_queries() -> list[tuple[str, str]]:
    """("ScaledObject name/trigger name", query) of every Prometheus trigger in k8s/keda.yaml."""
    docs = yaml.safe_load_all((ROOT / "k8s/keda.yaml").read_text())
    return [
        (f'{d["metadata"]["name"]}/{t.get("name", t["type"])}', t["metadata"]["query"])
        for d in docs
        if d and d["kind"] == "ScaledObject"
        for t in d["spec"]["triggers"]
        if t["type"] == "prometheus"
    ]
