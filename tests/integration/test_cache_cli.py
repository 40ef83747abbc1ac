"""`torchfarm cache stats|ls|evict` and `torchfarm status`, with a real stack, and the
coordinator's cache view (services/coordinator/cache.py) against a real redis-server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
import torch

import sdk
from examples.models import make_mlp
from localfarm.fakes import InlineDispatcher
from sdk import report
from services.coordinator.cache import CacheService, Filters
from services.coordinator.errors import InvalidRequest
from services.coordinator.farm import Farm
from services.coordinator.settings import CoordinatorSettings
from tests.requests import relu_request
from torchfarm.trust.tokens import OPEN, Tenant
from torchfarm.wire import keys
from torchfarm.wire.manifest import BlobRef, Manifest, blob_digest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TORCHFARM = [sys.executable, "-m", "cli"]


def cli(stack, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [*TORCHFARM, *args, "--remote", stack.address], capture_output=True, text=True, timeout=120
    )
    if check:
        assert out.returncode == 0, out.stderr
    return out


def cli_json(stack, *args: str) -> dict:
    return json.loads(cli(stack, *args, "--json").stdout)


def compile_mlp(stack, batch: int) -> list[report.GraphReport]:
    """One training step of the example MLP through the farm; the graphs' reports."""
    torch._dynamo.reset()
    model, (x,) = make_mlp(batch=batch)
    with report.collect() as graphs:
        sdk.compile(model, remote=stack.address, fallback="error")(x).pow(2).mean().backward()
    return list(graphs)


@pytest.mark.slow
def test_ls_stats_and_evict_through_the_coordinator(stack, client_cache_dir):
    graphs = compile_mlp(stack, batch=7)
    key = graphs[0].key
    entry = lambda listing: next(e for e in listing["entries"] if e["key"] == key)  # noqa: E731

    before = entry(cli_json(stack, "cache", "ls", "--limit", "1000"))
    assert before["label"].startswith("MLP (examples.models) graph 1 from ")  # the model's module
    assert before["target"] == graphs[0].target and before["bytes"] == graphs[0].bytes
    assert before["kernels"] == graphs[0].kernels and before["age_seconds"] >= 0

    assert [g.outcome for g in compile_mlp(stack, batch=7)] == [report.HIT] * len(graphs)
    listing = cli_json(stack, "cache", "ls", "--limit", "1000")
    after = entry(listing)
    assert after["hits"] == before["hits"] + 1
    assert 0 <= after["last_hit_seconds"] < 60

    stats = cli_json(stack, "cache", "stats")
    assert stats["entries"] == []  # totals only
    assert stats["matched"] == len(listing["entries"])
    assert stats["hits"] == sum(e["hits"] for e in listing["entries"])
    mine = next(t for t in stats["targets"] if t["target"] == graphs[0].target)
    assert mine["entries"] >= 1 and mine["bytes"] >= graphs[0].bytes
    assert stats["bytes"] <= sum(e["bytes"] for e in listing["entries"])  # shared blobs once

    # Filters.
    assert cli_json(stack, "cache", "ls", "--target", "cuda:sm_90")["matched"] == 0
    assert key not in [e["key"] for e in cli_json(stack, "cache", "ls", "--older-than", "1d")["entries"]]
    one = cli_json(stack, "cache", "ls", "--limit", "1")
    assert len(one["entries"]) == 1 and one["matched"] == len(listing["entries"])

    # The tables.
    table = cli(stack, "cache", "ls").stdout
    assert table.splitlines()[0].split() == ["KEY", "LABEL", "TARGET", "BYTES", "HITS", "AGE", "LAST", "HIT"]
    assert key[:12] in table
    stats_text = cli(stack, "cache", "stats").stdout
    assert stats_text.splitlines()[0].split()[:3] == ["TARGET", "HIT", "RATE"]
    assert "MLP (examples.models)" in stats_text  # per model
    assert "hit rate" in cli(stack, "status").stdout

    # Key prefixes, as the views print them, wherever a key is taken.
    explained = cli(stack, "explain", key[:12], check=False)
    assert "not a key" not in explained.stderr and "Traceback" not in explained.stderr

    # Bulk eviction: listed with --dry-run, refused without a terminal or --yes.
    dry = cli(stack, "cache", "evict", "--all", "--dry-run")
    assert key[:12] in dry.stdout and "would evict" in dry.stdout
    refused = cli(stack, "cache", "evict", "--all", check=False)
    assert refused.returncode == 2 and "without --yes" in refused.stderr
    assert key in [e["key"] for e in cli_json(stack, "cache", "ls", "--limit", "1000")["entries"]]

    # Evict by a short key: gone from the listing, and the next compile misses.
    out = cli(stack, "cache", "evict", key[:12])
    assert f"evicted {key}" in out.stdout
    assert key not in [e["key"] for e in cli_json(stack, "cache", "ls", "--limit", "1000")["entries"]]
    outcomes = [g.outcome for g in compile_mlp(stack, batch=7)]
    assert outcomes[0] == report.COMPILED

    missing = cli(stack, "cache", "evict", "0123456789ab", check=False)
    assert missing.returncode == 1 and "no entry 0123456789ab" in missing.stderr
    bad = cli(stack, "cache", "evict", "nothex!", check=False)
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr
    assert cli(stack, "cache", "evict", check=False).returncode == 2
    soon = cli(stack, "cache", "ls", "--older-than", "soon", check=False)
    assert soon.returncode != 0 and "not an age" in soon.stderr


def test_status_shows_workers_per_target_and_in_flight_jobs(stack):
    store = stack.store()
    name, worker = next(iter(store.live_workers().items()))
    queue = worker["queues"][0]
    key = "f" * 64  # a job record as a worker keeps it, for a job no worker will take
    assert store.create_job(key, queue, "Net graph 3 from testhost", ttl_s=60)
    store.update_job(key, state="RUNNING", stage="lowering", attempts=1)
    try:
        status = cli_json(stack, "status")
        (job,) = [j for j in status["in_flight"] if j["key"] == key]
        assert job["stage"] == "lowering" and job["state"] == "RUNNING"
        info = next(i for i in status["job_info"] if i["key"] == key)
        assert info["label"] == "Net graph 3 from testhost" and info["queue"] == queue
        assert next(q for q in status["queues"] if q["name"] == queue)["running"] >= 1

        table = cli(stack, "status").stdout
        assert "IN FLIGHT" in table and "Net graph 3 from testhost" in table
        # the workers' table, after the hit rates per target when the cache holds any
        lines = table.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("TARGET") and "WORKERS" in line)
        assert lines[at].split() == ["TARGET", "GRAPH", "WORKERS", "KERNEL", "WORKERS", "WORKERS", "LAST", "SEEN"]
        target = next(iter(worker["targets"]))
        row = next(line for line in lines[at:] if line.startswith(target + " "))
        assert row.split()[1:4] == [name, "-", "1"]  # graph workers, kernel workers, count
    finally:
        store.delete_job(key)
        store.r.delete(f"tf:stat:{key}")
    assert key not in [j["key"] for j in cli_json(stack, "status").get("in_flight", [])]


# The coordinator's cache view, against a real redis-server.


def _put(store, key: str, payload: bytes, created: float, device: str = "cpu") -> None:
    ref = BlobRef(blob_digest(payload), len(payload))
    store.put_blob(ref.digest, payload)
    fingerprint = {"device": device, "isa": "avx512" if device == "cpu" else "", "arch": "sm_90" if device == "cuda" else ""}
    store.put_manifest(Manifest(key=key, fingerprint=fingerprint, payload=ref, worker="w1", created=created))


def test_cache_view_is_scoped_to_the_tenant_and_counts_hits(store):
    farm = Farm(CoordinatorSettings(), store, InlineDispatcher(down=AssertionError("no job is queued in these tests")))
    cache = CacheService(farm, farm.runner)
    alice, bob = Tenant("alice", "alice"), Tenant("bob", "bob")
    req = relu_request()
    now = time.time()
    for tenant, payload in ((alice, b"alice's"), (bob, b"bob's"), (OPEN, b"open")):
        _put(store.tenant(tenant.namespace), keys.compute_key(req, tenant.namespace), payload, now)
    _put(store.tenant("alice"), "ab" * 32, b"shared blob", now - 7200, device="cuda")
    _put(store.tenant("alice"), "ab" * 31 + "cd", b"shared blob", now - 7200, device="cuda")

    async def scenario():
        assert (await farm.submit(req, req.ByteSize(), alice)).cache_hit
        assert (await farm.submit(req, req.ByteSize(), alice)).cache_hit
        return (
            await cache.list(Filters(), 100, alice),
            await cache.list(Filters(), 100, bob),
            await cache.list(Filters(), 100, OPEN),
            await cache.list(Filters(target="cuda:sm_90"), 100, alice),
            await cache.list(Filters(older_than_s=3600), 1, alice),
        )

    mine, bobs, open_, cuda, old = asyncio.run(scenario())
    alice_key = keys.compute_key(req, "alice")
    assert {e.key for e in mine.entries} == {alice_key, "ab" * 32, "ab" * 31 + "cd"}
    assert [e.hits for e in mine.entries if e.key == alice_key] == [2]
    assert mine.matched.hits == 2 and mine.by_target["cpu:avx512"].hits == 2
    assert mine.by_target["cuda:sm_90"].bytes == len(b"shared blob")  # one shared blob
    assert [e.key for e in bobs.entries] == [keys.compute_key(req, "bob")]
    assert bobs.entries[0].hits == 0
    assert [e.key for e in open_.entries] == [keys.compute_key(req, "")]
    assert {e.key for e in cuda.entries} == {"ab" * 32, "ab" * 31 + "cd"}
    assert len(old.entries) == 1 and old.matched.entries == 2

    with pytest.raises(InvalidRequest, match="matches 2 entries"):
        asyncio.run(cache.evict(Filters(keys=("abababab",)), False, alice))
    with pytest.raises(InvalidRequest, match="needs keys"):
        asyncio.run(cache.evict(Filters(), False, alice))
    with pytest.raises(InvalidRequest):
        asyncio.run(cache.list(Filters(target="gpu:9000"), 10, alice))

    # Bob cannot evict Alice's entry even by its full key; Alice can.
    assert asyncio.run(cache.evict(Filters(keys=(alice_key,)), False, bob)) == []
    assert [e.key for e in asyncio.run(cache.evict(Filters(keys=(alice_key,)), False, alice))] == [alice_key]
    assert store.tenant("alice").get_manifest_bytes(alice_key) is None
    assert not store.r.exists(f"tf:stat:alice:{alice_key}")
    evicted = asyncio.run(cache.evict(Filters(target="cuda:sm_90"), False, alice))
    assert len(evicted) == 2 and asyncio.run(cache.list(Filters(), 10, alice)).matched.entries == 0
    assert asyncio.run(cache.list(Filters(), 10, bob)).matched.entries == 1  # untouched
