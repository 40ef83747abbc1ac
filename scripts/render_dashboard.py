"""Draws ops/grafana/dashboards/torchfarm.json with matplotlib, from a real Prometheus.

Grafana cannot be installed where this project is built, so docs/img/dashboard.png is
drawn here instead: the same panels, grid, queries and legends, and the data that
Prometheus returns for them. It is a preview of the dashboard, not a Grafana
screenshot.

    .venv/bin/python scripts/render_dashboard.py --demo
        starts a local farm and a Prometheus (Debian's `prometheus`), runs a few compiles
        through it (examples/models.py), then draws the last minutes;
    .venv/bin/python scripts/render_dashboard.py --prometheus http://HOST:9090 --minutes 60
        draws from a Prometheus that scrapes a farm already.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DASHBOARD = ROOT / "ops/grafana/dashboards/torchfarm.json"
BG, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
COLORS = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9",
          "#96d98d", "#ffb357", "#ca95e5"]


def _get(url: str, path: str, **params: str) -> dict:
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=30) as r:
        return json.load(r)["data"]


def _fill(expr: str, rate: str) -> str:
    return expr.replace("$__rate_interval", rate)


def _legend(fmt: str, labels: dict) -> str:
    out = fmt
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out or ", ".join(f"{k}={v}" for k, v in labels.items()) or "value"


def _fmt(value: float, unit: str) -> str:
    if value != value:  # NaN
        return "n/a"
    if unit == "percentunit":
        return f"{value * 100:.0f}%"
    if unit == "bytes":
        for u in ("B", "KiB", "MiB", "GiB"):
            if abs(value) < 1024 or u == "GiB":
                return f"{value:.0f} {u}" if u == "B" else f"{value:.1f} {u}"
            value /= 1024
    if unit == "s":
        return f"{value:.3g} s"
    return f"{value:.3g}"


def render(url: str, out: Path, minutes: float, rate: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_h = 0.42  # inches per grid row
    fig = plt.figure(figsize=(20, rows * unit_h + 0.8), facecolor=BG)
    fig.text(0.01, 1 - 0.35 / (rows * unit_h + 0.8), f"{dash['title']}   ·   last {minutes:.0f} min",
             color=TEXT, fontsize=15, weight="bold", va="center")
    end = time.time()
    start = end - minutes * 60
    step = max(1.0, minutes * 60 / 240)
    top = 1 - 0.7 / (rows * unit_h + 0.8)
    for p in panels:
        g = p["gridPos"]
        pad = 0.004
        left, width = g["x"] / 24 + pad, g["w"] / 24 - 2 * pad
        height = g["h"] / rows * top - 2 * pad
        bottom = top - (g["y"] + g["h"]) / rows * top + pad
        cell = fig.add_axes((left, bottom, width, height), facecolor=PANEL)
        cell.set_xticks([]), cell.set_yticks([])
        for side in cell.spines.values():
            side.set_color(GRID)
        cell.text(0.01, 0.985, p["title"], color=TEXT, fontsize=10, weight="bold",
                  ha="left", va="top", transform=cell.transAxes)
        # The plot sits inside the panel, leaving room for the title and the ticks.
        fw, fh = fig.get_size_inches()
        mx, mt, mb = 0.75 / fw, 0.32 / fh, 0.3 / fh
        ax = fig.add_axes((left + mx, bottom + mb, width - mx - 0.2 / fw, height - mt - mb),
                          facecolor="none")
        for side in ax.spines.values():
            side.set_color(GRID)
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        if p["type"] == "stat":
            (t,) = p["targets"]
            res = _get(url, "/api/v1/query", query=_fill(t["expr"], rate), time=str(end))["result"]
            value = float(res[0]["value"][1]) if res else float("nan")
            ax.text(0.5, 0.5, _fmt(value, unit), color=COLORS[0], fontsize=24, weight="bold",
                    ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
        elif p["type"] == "table":
            (t,) = p["targets"]
            res = _get(url, "/api/v1/query", query=t["expr"], time=str(end))["result"]
            cols = ["component", "version", "python", "torch", "job", "instance"]
            ax.set_xticks([]), ax.set_yticks([])
            ax.set_axis_off()
            ax.text(0.01, 0.85, "   ".join(f"{c:<22}" for c in cols), color=TEXT, weight="bold",
                    family="monospace", fontsize=9, transform=ax.transAxes)
            for i, r in enumerate(res):
                line = "   ".join(f"{r['metric'].get(c, ''):<22}" for c in cols)
                ax.text(0.01, 0.68 - i * 0.16, line, color=TEXT, family="monospace", fontsize=9,
                        transform=ax.transAxes)
        else:
            n = 0
            for t in p["targets"]:
                res = _get(url, "/api/v1/query_range", query=_fill(t["expr"], rate),
                           start=str(start), end=str(end), step=str(step))["result"]
                for series in res:
                    xs = [datetime.fromtimestamp(float(ts)) for ts, _ in series["values"]]
                    ys = [float(v) for _, v in series["values"]]
                    ax.plot(xs, ys, color=COLORS[n % len(COLORS)], linewidth=1.4,
                            label=_legend(t.get("legendFormat", ""), series["metric"]))
                    n += 1
            ax.tick_params(colors=TEXT, labelsize=8)
            ax.grid(color=GRID, linewidth=0.6)
            ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
            ax.set_xlim(datetime.fromtimestamp(start), datetime.fromtimestamp(end))
            if unit in ("percentunit",):
                ax.yaxis.set_major_formatter(lambda v, _: f"{v * 100:.0f}%")
            elif unit in ("bytes", "s"):
                ax.yaxis.set_major_formatter(lambda v, _, u=unit: _fmt(v, u))
            if n:
                ax.legend(loc="upper left", fontsize=7, ncol=3, frameon=False, labelcolor=TEXT)
            else:
                ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", transform=ax.transAxes)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80, facecolor=BG)
    print(f"wrote {out}")


_CLIENT = textwrap.dedent(
    """
    import torch, sdk
    from examples.models import {make}
    model, inputs = {make}()
    compiled = sdk.compile(model, remote={address!r}, fallback="error")
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), atol=1e-4, rtol=1e-4)
    """
)


def demo(out: Path) -> None:
    """A local farm and a Prometheus, a few minutes of compiles, then the picture."""
    import grpc
    import yaml

    from localfarm.stack import LocalStack, free_port
    from tests.ops.farm import foreign_build_request
    from torchfarm.v1 import farm_pb2, farm_pb2_grpc

    with tempfile.TemporaryDirectory(prefix="torchfarm-render-") as tmp:
        work = Path(tmp)
        metrics_port = free_port()
        with LocalStack(workers=1, metrics_port=metrics_port, workdir=work / "stack") as stack:
            prom_port = free_port()
            (work / "prometheus.yml").write_text(yaml.safe_dump({
                "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
                "rule_files": [str(ROOT / "ops/prometheus/alerts.yml")],
                "scrape_configs": [
                    {"job_name": "torchfarm-coordinator",
                     "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]},
                    {"job_name": "torchfarm-worker",
                     "static_configs": [{"targets": [f"127.0.0.1:{stack.worker_metrics_port(0)}"]}]},
                ],
            }))
            prom = subprocess.Popen(
                ["prometheus", f"--config.file={work / 'prometheus.yml'}",
                 f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            try:
                began = time.time()
                env = {**os.environ, "PYTHONPATH": str(ROOT)}
                # Misses, then hits (a new process finds the artifacts in the cache).
                for make in ("make_mlp", "make_cnn", "make_mlp", "make_cnn", "make_mlp"):
                    subprocess.run([sys.executable, "-c", _CLIENT.format(make=make, address=stack.address)],
                                   env=env, check=True, timeout=600)
                    time.sleep(5)
                with grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as ch:
                    stub = farm_pb2_grpc.CompileFarmStub(ch)
                    stub.Submit(foreign_build_request(stack.store(), "other"), timeout=10)
                    try:
                        stub.GetJob(farm_pb2.JobRef(key="0" * 64), timeout=10)
                    except grpc.RpcError:
                        pass
                time.sleep(20)
                render(f"http://127.0.0.1:{prom_port}", out, (time.time() - began) / 60 + 0.2,
                       rate="1m")
            finally:
                prom.terminate()
                prom.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", action="store_true", help="run a local farm and Prometheus first")
    ap.add_argument("--prometheus", default="", help="http://HOST:9090 of a Prometheus to draw from")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--rate-interval", default="1m", help="what Grafana's $__rate_interval becomes")
    ap.add_argument("--out", type=Path, default=ROOT / "docs/img/dashboard.png")
    args = ap.parse_args()
    if args.demo:
        demo(args.out)
    elif args.prometheus:
        render(args.prometheus.rstrip("/"), args.out, args.minutes, args.rate_interval)
    else:
        ap.error("give --demo or --prometheus")


if __name__ == "__main__":
    main()
