"""The staged pipeline's stage jobs as plain functions, against the in-memory store,
with the compile itself replaced: the barrier, idempotent kernel and assembly jobs, the
kernel cache, evicted binaries rebuilt, and the attempt cap. Stage jobs are "sent" into
a list and run by hand, in any order, as Celery would deliver them."""

from __future__ import annotations

import dataclasses
import hashlib
import threading

import pytest

from localfarm.memory_store import memory_store
from tests.requests import relu_request
from torchfarm.fx.cpp_kernels import KernelSpec, spec_args
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.storage.store import JobState
from torchfarm.trust.signing import Signer, TrustedKeys
from torchfarm.wire import builds, keys, routing
from torchfarm.wire.manifest import blob_digest
from workers import inprocess
from workers.board import StageBoard, kernel_cache_key, waiter_name
from workers.compiler import CompileFailed, Kernel, LoweredGraph
from workers.jobs import assemble, build, lower
from workers.runtime import WorkerContext
from workers.settings import WorkerSettings


@pytest.fixture
def store():
    """The store in memory (localfarm/memory_store.py): these tests are about
    the logic around Redis, which runs there unchanged, Lua scripts included."""
    return memory_store()


def _spec(i: int) -> bytes:
    args = spec_args({"main_code": f"// kernel {i}\n", "device_type": "cpu", "extra_flags": ()})
    return KernelSpec("CppCodeCache", args, output=0, outputs=1).to_bytes()


@pytest.fixture
def sent():
    return []


@pytest.fixture
def built():
    """Every spec the replaced `build_kernel` was asked to build."""
    return []


@pytest.fixture
def ctx(store, sent, built, monkeypatch):
    def start_kernel_build(spec: bytes):
        def build() -> Kernel:
            built.append(spec)
            return Kernel(name="k", kind="cpp", source=spec, binary=b"\x7fELF" + spec)

        return build

    monkeypatch.setattr(inprocess, "start_kernel_build", start_kernel_build)
    return WorkerContext(
        settings=WorkerSettings(kernel_batch=2, max_attempts=2),
        store=store,
        fingerprint=local_fingerprint(),
        name="w0",
        signer=Signer.generate(),
        send=lambda task, args, queue: sent.append((task, args, queue)),
    )


def _lowered(n: int) -> LoweredGraph:
    return LoweredGraph(
        payload=b"payload", specs=[_spec(i) for i in range(n)],
        timings={"compile": 1.0, "collect": 0.1, "decompose": 0.4, "lower": 0.6},
    )


def _start(store, ctx, n: int, namespace: str = "") -> str:
    request = relu_request()
    key = keys.compute_key(request, namespace)
    view = store.tenant(namespace)
    view.create_job(key, "cpu.avx2", "test", 600)
    view.update_job(key, state=JobState.RUNNING, started=1.0)
    lower.fan_out(key, dataclasses.replace(ctx, store=view), "cpu:avx2", _lowered(n), (), 0.05)
    return key


def _drain(ctx, sent, namespace: str = "") -> None:
    while sent:
        task, args, queue = sent.pop(0)
        assert queue == "stages.cpu.avx2.b" + builds.digest(ctx.fingerprint.to_dict())
        if task == routing.BUILD_KERNELS_TASK:
            build.run_kernel_batch(args[0], ctx, *args[1:])
        else:
            assert task == routing.ASSEMBLE_TASK
            assemble.run_assembly(args[0], ctx, args[1])


def test_kernels_fan_out_in_batches_and_the_last_one_sends_the_assembly(store, ctx, sent):
    key = _start(store, ctx, 5, "alice")
    assert [t for t, _, _ in sent] == [routing.BUILD_KERNELS_TASK] * 3  # 2 + 2 + 1
    view = store.tenant("alice")
    assert view.get_job(key).stage == "kernels" and view.get_job(key).kernels_total == 5
    # Deliver the batches in reverse: only the one that empties the set sends the assembly.
    sent.reverse()
    for _ in range(3):
        task, args, _ = sent.pop(0)
        build.run_kernel_batch(args[0], ctx, *args[1:])
    assert [t for t, _, _ in sent] == [routing.ASSEMBLE_TASK]
    _drain(ctx, sent)
    job = view.get_job(key)
    assert (job.state, job.kernels_done, job.kernels_hit) == (JobState.SUCCEEDED, 5, 0)
    manifest = view.get_manifest(key)
    assert [s["stage"] for s in manifest.stages] == ["decompose", "lower", "kernels", "assemble"]
    assert sorted(view.get_blob(k.binary.digest) for k in manifest.kernels) == sorted(
        b"\x7fELF" + _spec(i) for i in range(5)
    )
    TrustedKeys.parse(ctx.signer.trusted_entry()).verify(
        manifest, key=key, tenant="alice", fingerprint=ctx.fingerprint.to_dict()
    )
    assert StageBoard(view).get_plan(key) is None  # cleared after assembly


def test_redelivered_jobs_do_nothing_twice(store, ctx, sent, built):
    key = _start(store, ctx, 2)
    task, args, _ = sent[0]
    build.run_kernel_batch(args[0], ctx, *args[1:])
    build.run_kernel_batch(args[0], ctx, *args[1:])  # redelivered
    assert len(built) == 2  # the second delivery found both in the kernel cache
    assert store.get_job(key).kernels_done == 2
    _drain(ctx, sent[1:])
    assert store.get_job(key).state == JobState.SUCCEEDED
    before = store.get_manifest_bytes(key)
    assemble.run_assembly(key, ctx, "")  # redelivered after it finished
    assert store.get_manifest_bytes(key) == before


def test_a_graph_whose_kernels_are_all_cached_skips_kernel_generation(store, ctx, sent, built):
    _start(store, ctx, 3)
    _drain(ctx, sent)
    other = relu_request(torch_version="other-graph")  # another key, the same kernels
    key = keys.compute_key(other, "")
    store.create_job(key, "cpu.avx2", "test", 600)
    lower.fan_out(key, ctx, "cpu:avx2", _lowered(3), (), 0.05)
    assert [t for t, _, _ in sent] == [routing.ASSEMBLE_TASK]
    _drain(ctx, sent)
    job = store.get_job(key)
    assert (job.state, job.kernels_total, job.kernels_hit) == (JobState.SUCCEEDED, 3, 3)
    assert len(built) == 3  # built once, for the first graph only


def test_a_binary_evicted_before_assembly_is_built_again(store, ctx, sent, built):
    key = _start(store, ctx, 2)
    while sent[0][0] == routing.BUILD_KERNELS_TASK:
        _, args, _ = sent.pop(0)
        build.run_kernel_batch(args[0], ctx, *args[1:])
    store.delete_blob(blob_digest(b"\x7fELF" + _spec(0)))  # LRU eviction
    _drain(ctx, sent)
    assert store.get_job(key).state == JobState.SUCCEEDED
    assert built.count(_spec(0)) == 2


def test_a_kernel_job_delivered_past_the_cap_fails_the_compile(store, ctx, sent, built):
    key = _start(store, ctx, 1)
    _, args, _ = sent.pop(0)
    board = StageBoard(store)
    batch = hashlib.sha256(",".join(sorted(k for k, _ in args[3])).encode()).hexdigest()[:16]
    for _ in range(ctx.settings.max_attempts):  # earlier deliveries, each lost with its worker
        board.count(key, f"kattempts:{batch}")
    build.run_kernel_batch(args[0], ctx, *args[1:])
    job = store.get_job(key)
    assert (job.state, job.error_code) == (JobState.FAILED, "TOO_MANY_ATTEMPTS")
    assert sent == [] and built == []


# ---- kernels sent while the lowering runs ----------------------------------------


def _open(store, ctx, namespace: str = "") -> tuple[str, lower.KernelStream]:
    request = relu_request()
    key = keys.compute_key(request, namespace)
    view = store.tenant(namespace)
    view.create_job(key, "cpu.avx2", "test", 600)
    view.update_job(key, state=JobState.RUNNING, started=1.0)
    stream = lower.KernelStream(key, dataclasses.replace(ctx, store=view), "cpu:avx2")
    stream.open()
    return key, stream


def test_kernels_streamed_during_lowering_are_built_before_it_ends(store, ctx, sent, built):
    key, stream = _open(store, ctx)
    for i in range(3):
        stream(_spec(i))
    stream(_spec(0))  # asked for again: sent once
    assert [t for t, _, _ in sent] == [routing.BUILD_KERNELS_TASK]  # 0 and 1; 2 waits for a batch
    # The streamed batch is built while the lowering still runs: it must not start the
    # assembly, though it empties every kernel the job knew of so far.
    _drain(ctx, sent)
    assert sent == [] and store.get_job(key).stage != "assembling"
    assert StageBoard(store).pending(key) == {"lowering"}
    # Lowering ends: the artifact loads kernels 0-3. 2 is flushed, 3 was never streamed.
    lower.fan_out(key, ctx, "cpu:avx2", _lowered(4), (), 0.05, stream)
    assert [t for t, _, _ in sent] == [routing.BUILD_KERNELS_TASK] * 2
    assert store.get_job(key).kernels_total == 4 and store.get_job(key).kernels_done == 2
    _drain(ctx, sent)
    job = store.get_job(key)
    assert (job.state, job.kernels_done, job.kernels_hit) == (JobState.SUCCEEDED, 4, 0)
    assert sorted(built) == sorted(_spec(i) for i in range(4))
    # The manifest records when each build job was sent, for bench/scaling.py's schedule.
    kernels = next(s for s in store.get_manifest(key).stages if s["stage"] == "kernels")
    sends = kernels["sends"]
    assert len(sends) == 3 and sends[0][0] <= sends[1][0] <= sends[2][0] == kernels["lowered_after_s"]


def test_a_streamed_kernel_the_artifact_does_not_load_is_not_waited_for(store, ctx, sent, built):
    key, stream = _open(store, ctx)
    stream(_spec(9))  # asked for during the compile (an autotuning candidate, say)
    stream(_spec(0))
    stray_job = sent.pop(0)  # not delivered yet: a slow worker has it
    lower.fan_out(key, ctx, "cpu:avx2", _lowered(1), (), 0.05, stream)
    assert sent == [] or [t for t, _, _ in sent] == [routing.ASSEMBLE_TASK]
    assert StageBoard(store).pending(key) == {kernel_cache_key(
        _spec(0), "cpu:avx2", ctx.fingerprint.to_dict())}
    # The batch holds the stray and kernel 0; built, it releases 0 and the job assembles.
    sent.append(stray_job)
    _drain(ctx, sent)
    job = store.get_job(key)
    assert (job.state, job.kernels_total, job.kernels_done) == (JobState.SUCCEEDED, 1, 1)
    assert [k.source.digest for k in store.get_manifest(key).kernels] == [blob_digest(_spec(0))]


def test_when_streamed_builds_finish_first_the_lowering_sends_the_assembly(store, ctx, sent):
    key, stream = _open(store, ctx)
    stream(_spec(0))
    stream(_spec(1))
    _drain(ctx, sent)
    lower.fan_out(key, ctx, "cpu:avx2", _lowered(2), (), 0.05, stream)
    assert [t for t, _, _ in sent] == [routing.ASSEMBLE_TASK]
    _drain(ctx, sent)
    assert store.get_job(key).state == JobState.SUCCEEDED


def test_a_lowering_that_gives_way_leaves_no_barrier(store, ctx, sent):
    key, stream = _open(store, ctx)
    stream(_spec(0))
    stream(_spec(1))
    stream.abandon()
    assert StageBoard(store).pending(key) == {"abandoned"}
    _drain(ctx, sent)  # the build still runs, for the kernel cache; no assembly follows
    assert StageBoard(store).cached_binaries(
        [kernel_cache_key(_spec(0), "cpu:avx2", ctx.fingerprint.to_dict())]
    )
    assert store.get_manifest(key) is None
    # The whole-graph compile that took over is still running: nothing failed it.
    assert store.get_job(key).state == JobState.RUNNING


def test_a_worker_of_another_build_refuses_a_kernel_keyed_for_this_one(store, ctx, sent, built):
    key, stream = _open(store, ctx)
    stream(_spec(0))
    stream(_spec(1))
    _, args, _ = sent.pop(0)
    other = dataclasses.replace(
        ctx, fingerprint=dataclasses.replace(ctx.fingerprint, torch_git="another-build")
    )
    build.run_kernel_batch(args[0], other, *args[1:])
    job = store.get_job(key)
    assert (job.state, job.error_code) == (JobState.FAILED, "BUILD_MISMATCH") and built == []


def test_a_batch_builds_its_kernels_at_once_up_to_the_cores(store, ctx, sent, monkeypatch):
    both_inside = threading.Barrier(2, timeout=10)

    def start_kernel_build(spec: bytes):
        def build() -> Kernel:
            both_inside.wait()  # breaks (and the job fails) if the builds run one by one
            return Kernel(name="k", kind="cpp", source=spec, binary=b"\x7fELF" + spec)

        return build

    monkeypatch.setattr(inprocess, "start_kernel_build", start_kernel_build)
    monkeypatch.setattr(build, "build_threads", lambda: 2)
    key = _start(store, ctx, 2)
    _drain(ctx, sent)
    assert store.get_job(key).state == JobState.SUCCEEDED


def test_a_kernel_cache_scoped_to_tenants_shares_nothing_between_them(store, ctx, sent, built):
    scoped = dataclasses.replace(
        ctx, settings=dataclasses.replace(ctx.settings, kernel_cache_scope="tenant")
    )
    _start(store, scoped, 2, "alice")
    _drain(scoped, sent)
    key = _start(store, scoped, 2, "bob")  # the same kernels
    _drain(scoped, sent)
    job = store.tenant("bob").get_job(key)
    assert (job.state, job.kernels_hit) == (JobState.SUCCEEDED, 0)
    assert len(built) == 4  # built once per tenant
    # Fleet-wide (the default), the scoped binaries are not found, and what carol's
    # compile builds, dave's finds.
    _start(store, ctx, 2, "carol")
    _drain(ctx, sent)
    key = _start(store, ctx, 2, "dave")
    _drain(ctx, sent)
    assert store.tenant("dave").get_job(key).kernels_hit == 2 and len(built) == 6


# ---- one build per kernel across the jobs in flight --------------------------------


def test_jobs_in_flight_that_share_kernels_build_each_once(store, ctx, sent, built):
    first = _start(store, ctx, 4, "alice")  # kernels 0-3, their builds not yet run
    second = _start(store, ctx, 6, "bob")  # kernels 0-5: only 4 and 5 are its own to build
    builds = [args for task, args, _ in sent if task == routing.BUILD_KERNELS_TASK]
    assert [len(args[3]) for args in builds if args[1] == "bob"] == [2]
    sent.reverse()  # bob's build first: alice's builds then release both jobs
    _drain(ctx, sent)
    assert sorted(built) == sorted(_spec(i) for i in range(6))  # each once
    a, b = store.tenant("alice").get_job(first), store.tenant("bob").get_job(second)
    assert (a.state, a.kernels_done, a.kernels_hit) == (JobState.SUCCEEDED, 4, 0)
    assert (b.state, b.kernels_done, b.kernels_hit) == (JobState.SUCCEEDED, 6, 4)
    assert store.r.keys("tf:kclaim:*") == [] and store.r.keys("tf:kwait:*") == []


def test_a_streamed_kernel_another_job_builds_is_waited_for(store, ctx, sent, built):
    first = _start(store, ctx, 2, "alice")
    alice_builds, sent[:] = list(sent), []
    key, stream = _open(store, ctx, "bob")
    stream(_spec(0))
    stream(_spec(1))  # a full batch, both claimed by alice: no build job
    assert sent == [] and stream.shared == 2
    assert StageBoard(store.tenant("bob")).pending(key) > {"lowering"}
    lower.fan_out(key, dataclasses.replace(ctx, store=store.tenant("bob")), "cpu:avx2",
                     _lowered(2), (), 0.05, stream)
    assert sent == []
    _drain(ctx, alice_builds)  # alice's builds send both assemblies
    assert sorted(t for t, _, _ in sent) == [routing.ASSEMBLE_TASK] * 2
    _drain(ctx, sent)
    assert len(built) == 2
    assert store.tenant("alice").get_job(first).state == JobState.SUCCEEDED
    assert store.tenant("bob").get_job(key).kernels_hit == 2


def test_a_waiter_builds_the_kernel_when_the_claiming_job_fails(store, ctx, sent, built):
    first = _start(store, ctx, 2, "alice")
    second = _start(store, ctx, 2, "bob")  # waits for alice's builds
    assert [args[1] for _, args, _ in sent] == ["alice"]
    store.tenant("alice").fail_job(first, "CANCELLED", "the client went away", 60)
    sent.append(sent[0])  # alice's build, delivered twice
    _, args, _ = sent.pop(0)
    build.run_kernel_batch(args[0], ctx, *args[1:])  # dropped: hands the kernels to bob
    assert [args[1] for _, args, _ in sent] == ["alice", "bob", "bob"]  # a job per kernel
    _, args, _ = sent.pop(0)
    build.run_kernel_batch(args[0], ctx, *args[1:])  # bob holds the claims now: no more
    assert [args[1] for _, args, _ in sent] == ["bob", "bob"]
    claims = store.r.mget(store.r.keys("tf:kclaim:*"))
    assert claims == [waiter_name("bob", second, "cpu:avx2").encode()] * 2
    _drain(ctx, sent)
    job = store.tenant("bob").get_job(second)
    assert (job.state, job.kernels_hit) == (JobState.SUCCEEDED, 0)
    assert sorted(built) == sorted(_spec(i) for i in range(2))


def test_a_kernel_that_fails_to_build_fails_its_waiters_too(store, ctx, sent, monkeypatch):
    def start_kernel_build(spec: bytes):
        raise CompileFailed("g++: internal compiler error")

    monkeypatch.setattr(inprocess, "start_kernel_build", start_kernel_build)
    first = _start(store, ctx, 1, "alice")
    second = _start(store, ctx, 1, "bob")
    _drain(ctx, sent)
    for tenant, key in (("alice", first), ("bob", second)):
        job = store.tenant(tenant).get_job(key)
        assert job.state == JobState.FAILED and "internal compiler error" in job.message


def test_a_redelivered_lowering_sends_the_builds_it_claimed_again(store, ctx, sent, built):
    key, stream = _open(store, ctx)
    stream(_spec(0))
    stream(_spec(1))
    sent.clear()  # its worker was lost before the build job reached the broker
    key, stream = _open(store, ctx)  # the lowering, redelivered
    stream(_spec(0))
    stream(_spec(1))
    assert [t for t, _, _ in sent] == [routing.BUILD_KERNELS_TASK]
    lower.fan_out(key, ctx, "cpu:avx2", _lowered(2), (), 0.05, stream)
    _drain(ctx, sent)
    assert store.get_job(key).state == JobState.SUCCEEDED and len(built) == 2


def test_a_claim_whose_build_was_never_sent_lapses(store, ctx, sent, built):
    _start(store, ctx, 2, "alice")
    sent.clear()  # alice's worker was lost between the claim and the send, for good
    _start(store, ctx, 2, "bob")
    assert sent == []  # bob waits on alice's claims
    claims = store.r.keys("tf:kclaim:*")
    assert len(claims) == 2
    assert all(0 < store.r.ttl(c) <= ctx.settings.visibility_timeout_s for c in claims)
    store.r.delete(*claims)  # lapsed
    # The coordinator finds bob's job stale and queues it again: this time it claims
    # the kernels itself.
    key = _start(store, ctx, 2, "bob")
    _drain(ctx, sent)
    assert store.tenant("bob").get_job(key).state == JobState.SUCCEEDED and len(built) == 2
