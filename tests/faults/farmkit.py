"""Helpers for the fault tests: real graphs as CompileRequests, a client that goes
through the SDK's own submit/wait/fetch/verify path, and process surgery on a stack."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from localfarm.stack import LocalStack
from sdk import artifact
from sdk.backend import FarmBackend, build_request
from sdk.settings import SDKSettings
from torchfarm.fx.encode import encode_graph
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.storage.store import JobRecord, JobState, Store
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys
from torchfarm.wire.manifest import Manifest
from workers.board import StageBoard

FIGURES: dict[str, dict] = {}
"""Measurements each test records; printed at the end of the session (pytest -s)."""


def graph_request(size: int, depth: int = 1, label: str = "fault test") -> farm_pb2.CompileRequest:
    """A CompileRequest for a small real graph; `size` and `depth` make distinct keys."""
    captured: dict = {}

    def backend(gm, example_inputs):
        captured["gm"], captured["inputs"] = gm, example_inputs
        return gm.forward

    def fn(x, w):
        y = x
        for _ in range(depth):
            y = torch.tanh(y @ w) + y.sin()
        return y.sum()

    torch._dynamo.reset()
    x, w = torch.randn(size, size), torch.randn(size, size)
    torch.compile(fn, backend=backend, fullgraph=True)(x, w)
    torch._dynamo.reset()
    graph = encode_graph(captured["gm"], captured["inputs"])
    return build_request(graph, local_fingerprint(), "", {}, label)


@dataclass
class Outcome:
    reply: farm_pb2.SubmitReply
    status: farm_pb2.JobStatus | None
    manifest: Manifest
    seconds: float


class Client:
    """The SDK's remote path without Dynamo: FarmBackend's submit/wait (with its
    resubmit on a lost job), the client's fetch, and artifact.verify with the trust
    the settings give (pinned keys, namespace from the token)."""

    def __init__(self, stack: LocalStack, tenant: str = "", **overrides):
        env = stack.client_env(tenant)
        self.settings = SDKSettings(
            remote=env["TORCHFARM_REMOTE"],
            token=env.get("TORCHFARM_TOKEN", ""),
            trusted_keys_file=env.get("TORCHFARM_TRUSTED_KEYS_FILE", ""),
            fallback="error",
            **overrides,
        )
        self.backend = FarmBackend(self.settings, name="fault-test")
        self.farm = self.backend.client
        self.trust = self.backend.trust

    def compile(self, request: farm_pb2.CompileRequest) -> Outcome:
        t0 = time.monotonic()
        reply, status = self.farm.submit_and_wait(request, key=self.key(request))
        manifest = self.fetch_verified(reply.key)
        return Outcome(reply, status, manifest, time.monotonic() - t0)

    def fetch_verified(self, key: str) -> Manifest:
        manifest_bytes, blobs = self.farm.fetch(key)
        return artifact.verify(manifest_bytes, blobs, key, local_fingerprint(), self.trust)

    def key(self, request: farm_pb2.CompileRequest) -> str:
        return keys.compute_key(request, self.trust.namespace)


def wait_for(pred: Callable[[], object], timeout_s: float, what: str, every_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:.0f}s")
        time.sleep(every_s)


def in_background(fn: Callable[[], object]) -> tuple[threading.Thread, dict]:
    """Runs `fn` in a thread; its "result" (or the "error" it raised) lands in the box."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:  # re-raised by join_client
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def join_client(t, box: dict, timeout_s: float = 300):
    """Joins a client thread that put its "result" (or "error") into `box`."""
    t.join(timeout_s)
    assert not t.is_alive(), "the client did not finish"
    if "error" in box:
        raise box["error"]
    return box["result"]


def compiling(store: Store, key: str) -> bool:
    """True while a worker runs the lowering job of `key`'s staged compile
    (workers/jobs/lower.py), where Inductor runs: the longest stage of a small graph."""
    j = job(store, key)
    return (
        j is not None and j.state == JobState.RUNNING and j.stage == "lowering"
        and "l_worker" in StageBoard(store).job_fields(key)
    )


def deliveries(store: Store, key: str) -> tuple[int, int]:
    """How often `key`'s graph job (the decomposition) and its lowering job were delivered."""
    fields = StageBoard(store).job_fields(key)
    return int(fields.get("attempts", 0)), int(fields.get("lower_attempts", 0))


def job(store: Store, key: str) -> JobRecord | None:
    try:
        return store.get_job(key)
    except Exception:  # Redis down in the middle of a fault test
        return None


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return sorted(out)


def pool_child(stack: LocalStack, worker: str = "worker0") -> int:
    """The Celery prefork pool process of a worker started with --concurrency 1."""
    leader = stack.procs[worker].pid
    kids = wait_for(lambda: children(leader), 30, f"{worker}'s pool process")
    return kids[0]


def kill_group(stack: LocalStack, name: str) -> None:
    """SIGKILL a stack process and everything in its process group, as a lost machine."""
    p = stack.procs.pop(name)
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(30)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0
