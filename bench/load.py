"""Load test (`make bench-load`): N client processes against a real local farm.

The farm is the embedded stack (redis-server, the coordinator, CPU workers) with tokens
and signed artifacts, as a shared farm runs. The parent builds D distinct small real
graphs (captured by Dynamo, as the SDK would) and hands their CompileRequests to N
client processes. For a bounded time each client loops: pick a graph (all start on the
same one, then mostly a small hot set, sometimes any), submit, wait if it was not a
hit, fetch, and verify the signature, namespace, fingerprint and every blob digest,
as the SDK does before loading. The clients never import torch.

With `--compare` (what `make bench-load` runs) it measures two farms side by side in one
run: everything on (tokens, TLS, signed artifacts that every client verifies) and
everything off (an open farm in plaintext, unsigned artifacts, only the blob digests
checked), and prints requests/s and p99 hit latency of each and their ratios. Target:
with everything on, at most 10 % fewer requests/s and at most 10 % higher p99. Both
farms' workers run compiles in the sandbox (the default, `TORCHFARM_SANDBOX=auto`); the
figures are hits', which compile nothing, so the sandbox does not enter them.

It reports throughput, p50/p99 latency of hits (submit + fetch + verify), how many
submits joined an in-flight compile, how many compiles the workers actually ran (the
job records' delivery counts), errors, and the coordinator's resident memory at the
start and the end. Targets: zero errors and exactly one compile per distinct graph;
the exit status is 1 when either is missed.

    .venv/bin/python bench/load.py [--clients 8] [--graphs 6] [--seconds 60] [--workers 1] [--compare]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build_requests(count: int) -> list[bytes]:
    """`count` distinct small graphs as serialized CompileRequests (imports torch)."""
    import torch

    from sdk.backend import build_request
    from torchfarm.fx.encode import encode_graph
    from torchfarm.fx.fingerprint import local_fingerprint

    out = []
    for i in range(count):
        captured: dict = {}

        def backend(gm, example_inputs, captured=captured):
            captured["gm"], captured["inputs"] = gm, example_inputs
            return gm.forward

        def fn(x, w):
            return (torch.tanh(x @ w) + x.sin()).sum()

        n = 8 + 4 * i
        torch._dynamo.reset()
        torch.compile(fn, backend=backend, fullgraph=True)(torch.randn(n, n), torch.randn(n, n))
        graph = encode_graph(captured["gm"], captured["inputs"])
        out.append(build_request(graph, local_fingerprint(), "", {}, f"load graph {i}").SerializeToString())
    torch._dynamo.reset()
    return out


def client_main(index: int, env: dict, requests: list[bytes], fingerprint: dict, seconds: float,
                hot: int, results, start) -> None:
    """One client process: once every client is ready (`start`, a barrier), loops for
    `seconds`, then puts its records and how long it ran on `results`."""
    from sdk.client import FarmClient
    from sdk.errors import FarmError
    from sdk.settings import SDKSettings
    from sdk.trust import Trust
    from torchfarm.v1 import farm_pb2
    from torchfarm.wire.manifest import Manifest, check_blobs

    settings = SDKSettings(
        remote=env["TORCHFARM_REMOTE"], token=env.get("TORCHFARM_TOKEN", ""),
        trusted_keys_file=env.get("TORCHFARM_TRUSTED_KEYS_FILE", ""),
        tls_ca_file=env.get("TORCHFARM_TLS_CA_FILE", ""), connect_timeout_s=10,
    )
    client = FarmClient(settings.remote, settings)
    # Signing off: no signature to verify; the blob digests are checked regardless.
    trust = Trust.from_settings(settings, client.address) if settings.trusted_keys_file else None
    rng = random.Random(index)
    parsed = [farm_pb2.CompileRequest.FromString(r) for r in requests]
    records = []
    first = True
    start.wait()  # process start and imports are not the farm's time
    began = time.time()
    deadline = began + seconds
    while time.time() < deadline:
        i = 0 if first else (rng.randrange(hot) if rng.random() < 0.8 else rng.randrange(len(parsed)))
        first = False
        t0 = time.perf_counter()
        try:
            reply = client.submit(parsed[i])
            if not reply.cache_hit:
                client.wait(reply.key)
            manifest_bytes, blobs = client.fetch(reply.key)
            manifest = Manifest.from_json(manifest_bytes)
            if trust is not None:
                trust.keys.verify(manifest, key=reply.key, tenant=trust.namespace, fingerprint=fingerprint)
            check_blobs(manifest, blobs)
            outcome = "hit" if reply.cache_hit else ("joined" if reply.deduplicated else "miss")
            records.append((i, outcome, time.perf_counter() - t0, ""))
        except (FarmError, ValueError) as e:
            records.append((i, "error", time.perf_counter() - t0, f"{type(e).__name__}: {e}"))
    client.close()
    results.put((records, time.time() - began))


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def warm_cache(env: dict, requests: list[bytes]) -> None:
    """Compiles each graph once before the clients start, so they measure hits only."""
    from sdk.client import FarmClient
    from sdk.settings import SDKSettings
    from torchfarm.v1 import farm_pb2

    settings = SDKSettings(remote=env["TORCHFARM_REMOTE"], token=env.get("TORCHFARM_TOKEN", ""),
                           tls_ca_file=env.get("TORCHFARM_TLS_CA_FILE", ""), connect_timeout_s=30)
    client = FarmClient(settings.remote, settings)
    for data in requests:
        reply = client.submit(farm_pb2.CompileRequest.FromString(data))
        if not reply.cache_hit:
            client.wait(reply.key)
    client.close()


def secure_stack(workers: int, workdir: Path) -> dict:
    """LocalStack arguments with everything on: tokens, TLS, signed artifacts."""
    from tests.tls import make_pki

    pki = make_pki(workdir)
    return dict(workers=workers, tenants=("load",), sign=True, tls_cert_file=str(pki["server_cert"]),
                tls_key_file=str(pki["server_key"]), tls_ca_file=str(pki["ca"]))


def run(args: argparse.Namespace, secure: bool = True, requests: list[bytes] | None = None) -> dict:
    import tempfile

    from localfarm.stack import LocalStack
    from torchfarm.fx.fingerprint import local_fingerprint

    requests = requests or build_requests(args.graphs)
    fingerprint = local_fingerprint().to_dict()
    pki_dir = tempfile.TemporaryDirectory(prefix="torchfarm-load-pki-")
    options = (secure_stack(args.workers, Path(pki_dir.name)) if secure
               else dict(workers=args.workers, sign=False, publish_key=False))
    tenant = "load" if secure else ""
    # No warm-up: the workers register at once (it only moves Inductor's setup into the
    # first compile, which the hit figures never include).
    with LocalStack(warmup=False, **options) as stack:
        coordinator = stack.procs["coordinator"].pid
        rss_start = rss_kb(coordinator)
        env = stack.client_env(tenant)
        if args.warm:
            warm_cache(env, requests)
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        start = ctx.Barrier(args.clients)
        t0 = time.time()
        procs = [
            ctx.Process(target=client_main,
                        args=(i, env, requests, fingerprint, args.seconds, args.hot, results, start))
            for i in range(args.clients)
        ]
        for p in procs:
            p.start()
        records = []
        throughput = 0.0
        for _ in procs:
            mine, ran_s = results.get(timeout=args.seconds + 900)
            records.extend(mine)
            throughput += len(mine) / max(ran_s, 1e-9)
        for p in procs:
            p.join(60)
        elapsed = time.time() - t0
        rss_end = rss_kb(coordinator)
        store = stack.store().tenant(tenant)
        from torchfarm.v1 import farm_pb2
        from torchfarm.wire import keys

        requested = sorted({i for i, *_ in records})
        compiles = {}
        for i in requested:
            key = keys.compute_key(farm_pb2.CompileRequest.FromString(requests[i]), tenant)
            job = store.get_job(key)
            compiles[i] = job.attempts if job else 0
    pki_dir.cleanup()
    hits = [t for _, o, t, _ in records if o == "hit"]
    errors = [r[3] for r in records if r[1] == "error"]
    report = {
        "security": "tokens, TLS, signing on" if secure else "all off",
        "clients": args.clients,
        "workers": args.workers,
        "seconds": round(elapsed, 1),
        "requests": len(records),
        "throughput_per_s": round(throughput, 1),
        "hits": len(hits),
        "hit_latency_p50_ms": round(1000 * percentile(hits, 0.50), 2),
        "hit_latency_p99_ms": round(1000 * percentile(hits, 0.99), 2),
        "misses": sum(1 for r in records if r[1] == "miss"),
        "joined_in_flight": sum(1 for r in records if r[1] == "joined"),
        "distinct_graphs": len(requested),
        "compiles_run": sum(compiles.values()),
        "compiles_per_graph": compiles,
        "errors": len(errors),
        "error_samples": errors[:5],
        "coordinator_rss_start_mb": round(rss_start / 1024, 1),
        "coordinator_rss_end_mb": round(rss_end / 1024, 1),
    }
    if hits:
        report["hit_latency_mean_ms"] = round(1000 * statistics.mean(hits), 2)
    return report


def compare(args: argparse.Namespace) -> dict:
    """Both farms in one run, on the same graphs: all off first, then all on."""
    requests = build_requests(args.graphs)
    off = run(args, secure=False, requests=requests)
    on = run(args, secure=True, requests=requests)
    ratio = {
        "throughput_on_over_off": round(on["throughput_per_s"] / max(off["throughput_per_s"], 1e-9), 3),
        "hit_p99_on_over_off": round(on["hit_latency_p99_ms"] / max(off["hit_latency_p99_ms"], 1e-9), 3),
    }
    ratio["target_met"] = ratio["throughput_on_over_off"] >= 0.9 and ratio["hit_p99_on_over_off"] <= 1.1
    return {"off": off, "on": on, "ratios": ratio}


def _table(result: dict) -> str:
    rows = [("", "req/s", "hit p50 ms", "hit p99 ms", "errors")]
    for name in ("off", "on"):
        r = result[name]
        rows.append((name, str(r["throughput_per_s"]), str(r["hit_latency_p50_ms"]),
                     str(r["hit_latency_p99_ms"]), str(r["errors"])))
    ratios = result["ratios"]
    rows.append(("on/off", str(ratios["throughput_on_over_off"]), "", str(ratios["hit_p99_on_over_off"]), ""))
    return "\n".join("".join(c.rjust(12) for c in row) for row in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--graphs", type=int, default=6, help="distinct graphs")
    ap.add_argument("--hot", type=int, default=2, help="graphs most requests go to")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the report here")
    ap.add_argument("--compare", action="store_true", help="everything on and everything off, side by side")
    ap.add_argument("--warm", action="store_true",
                    help="compile every graph before the clients start (--compare always does)")
    args = ap.parse_args()
    if args.compare:
        args.warm = True
        result = compare(args)
        text = json.dumps(result, indent=2)
        print(text)
        print(_table(result))
        if args.json:
            args.json.write_text(text + "\n")
        ok = all(result[n]["errors"] == 0 and result[n]["compiles_run"] == result[n]["distinct_graphs"]
                 for n in ("off", "on"))
        print("security overhead within 10 %" if result["ratios"]["target_met"] else "SECURITY OVERHEAD TARGET MISSED")
        print("target met: zero errors, one compile per distinct graph" if ok else "TARGET MISSED", flush=True)
        sys.exit(0 if ok and result["ratios"]["target_met"] else 1)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    ok = report["errors"] == 0 and report["compiles_run"] == report["distinct_graphs"]
    print("target met: zero errors, one compile per distinct graph" if ok else "TARGET MISSED", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
