"""Redis is storage, not a root of trust: what one worker stores and another acts on (a
staged job's plan and decomposition, the kernel cache, the kernel-build messages) is
sealed by the worker that made it and checked before use, and a build takes its
compiler flags from nothing it reads (docs/security.md).

Each test writes to Redis what an attacker who can write the cache Redis or the broker
could write, with a real redis-server.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.requests import relu_request
from torchfarm.fx.cpp_kernels import KernelSpec, spec_args
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.storage.store import JobState
from torchfarm.trust.seal import Seal
from torchfarm.trust.signing import Signer
from torchfarm.wire import keys, routing
from torchfarm.wire.manifest import blob_digest
from workers import inprocess
from workers.board import StageBoard, kernel_cache_key
from workers.compiler import Kernel, LoweredGraph
from workers.jobs import assemble, build, lower
from workers.runtime import WorkerContext
from workers.settings import WorkerSettings

pytestmark = pytest.mark.integration

TARGET = "cpu:avx2"


def _spec(i: int, extra_flags: tuple[str, ...] = ()) -> bytes:
    args = spec_args({"main_code": f"// kernel {i}\n", "device_type": "cpu", "extra_flags": extra_flags})
    return KernelSpec("CppCodeCache", args, output=0, outputs=1).to_bytes()


@pytest.fixture
def sent():
    return []


@pytest.fixture
def ctx(store, sent):
    signer = Signer.generate()
    return WorkerContext(
        settings=WorkerSettings(kernel_batch=2, max_attempts=2),
        store=store,
        fingerprint=local_fingerprint(),
        name="w0",
        signer=signer,
        seal=Seal.from_signer(signer),
        send=lambda task, args, queue: sent.append((task, args, queue)),
    )


@pytest.fixture
def fake_builds(monkeypatch):
    built = []

    def start_kernel_build(spec: bytes):
        def run() -> Kernel:
            built.append(spec)
            return Kernel(name="k", kind="cpp", source=spec, binary=b"\x7fELF" + spec)

        return run

    monkeypatch.setattr(inprocess, "start_kernel_build", start_kernel_build)
    return built


def _job(store) -> str:
    key = keys.compute_key(relu_request(), "")
    store.create_job(key, "cpu.avx2", "test", 600)
    store.update_job(key, state=JobState.RUNNING, started=1.0)
    return key


def _lowered(n: int) -> LoweredGraph:
    return LoweredGraph(
        payload=b"payload", specs=[_spec(i) for i in range(n)],
        timings={"compile": 1.0, "collect": 0.1, "decompose": 0.4, "lower": 0.6},
    )


def _deliver(ctx, sent, *, only: str | None = None) -> None:
    while sent and (only is None or sent[0][0] == only):
        task, args, _ = sent.pop(0)
        if task == routing.BUILD_KERNELS_TASK:
            build.run_kernel_batch(args[0], ctx, *args[1:])
        else:
            assemble.run_assembly(args[0], ctx, args[1])


def test_a_build_message_written_to_the_broker_runs_no_compiler_flag_of_its_own(
    store, ctx, tmp_path, monkeypatch
):
    """The exploit: a spec whose `extra_flags` hold `-wrapper` makes g++ run a shell."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    marker = tmp_path / "pwned"
    spec = _spec(0, ("-wrapper", f"/bin/sh,-c,touch${{IFS}}{marker}"))
    digest = blob_digest(spec)
    store.put_blob(digest, spec)
    key = _job(store)
    cache_key = kernel_cache_key(spec, TARGET, ctx.fingerprint.to_dict())
    build.run_kernel_batch(key, ctx, "", TARGET, [[cache_key, digest]])
    assert not marker.exists()
    assert StageBoard(store, ctx.seal).cached_binaries([cache_key]) == {}


def test_a_sealed_build_message_still_takes_no_flags_from_the_spec(store, ctx, tmp_path, monkeypatch):
    """Even a message a worker sealed builds only what the building worker's own
    Inductor would: a spec with extra flags is refused, and the job fails."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    marker = tmp_path / "pwned"
    spec = _spec(0, ("-wrapper", f"/bin/sh,-c,touch${{IFS}}{marker}"))
    digest = blob_digest(spec)
    store.put_blob(digest, spec)
    key = _job(store)
    refs = [[kernel_cache_key(spec, TARGET, ctx.fingerprint.to_dict()), digest]]
    mac = ctx.seal.mac("build", "", key, TARGET, json.dumps(refs))
    build.run_kernel_batch(key, ctx, "", TARGET, refs, mac)
    assert not marker.exists()
    job = store.get_job(key)
    assert (job.state, job.error_code) == (JobState.FAILED, "INVALID_KERNEL_SPEC")


def test_an_assembly_refuses_a_plan_rewritten_in_redis(store, ctx, sent, fake_builds):
    key = _job(store)
    lower.fan_out(key, ctx, TARGET, _lowered(2), (), 0.05)
    _deliver(ctx, sent, only=routing.BUILD_KERNELS_TASK)
    evil = b"import os; os.system('id')"
    store.put_blob(blob_digest(evil), evil)
    board = StageBoard(store, ctx.seal)
    plan = board.get_plan(key)
    forged = dataclasses.replace(plan, payload=dataclasses.replace(plan.payload, digest=blob_digest(evil)))
    store.r.set(f"tf:plan:{store.ref(key)}", forged.to_json())  # what an attacker can write
    _deliver(ctx, sent)
    assert store.get_manifest(key) is None
    job = store.get_job(key)
    assert (job.state, job.error_code) == (JobState.FAILED, "RECORD_TAMPERED")


def test_a_kernel_cache_record_rewritten_in_redis_is_not_signed_into_an_artifact(
    store, ctx, sent, fake_builds
):
    key = _job(store)
    lower.fan_out(key, ctx, TARGET, _lowered(2), (), 0.05)
    _deliver(ctx, sent, only=routing.BUILD_KERNELS_TASK)
    evil = b"\x7fELF evil"
    store.put_blob(blob_digest(evil), evil)
    cache_key = StageBoard(store, ctx.seal).get_plan(key).kernels[0].cache_key
    record = {"binary": {"digest": blob_digest(evil), "size": len(evil)}, "worker": "w9", "seconds": 0.1}
    store.r.set(f"tf:kbin:{cache_key}", json.dumps(record))
    _deliver(ctx, sent)  # the assembly finds the forged record unsealed: built again
    manifest = store.get_manifest(key)
    assert manifest is not None
    assert blob_digest(evil) not in {k.binary.digest for k in manifest.kernels}
    assert len(fake_builds) == 3  # two, then the one whose record was forged


def test_a_plan_whose_blob_was_replaced_in_redis_is_not_signed(store, ctx, sent, fake_builds):
    """Blobs are content-addressed; a blob rewritten under its digest is caught before
    the assembly signs, not only by the client."""
    key = _job(store)
    lower.fan_out(key, ctx, TARGET, _lowered(1), (), 0.05)
    _deliver(ctx, sent, only=routing.BUILD_KERNELS_TASK)
    payload = StageBoard(store, ctx.seal).get_plan(key).payload
    store.r.set(f"tf:blob:{payload.digest}", b"something else")
    _deliver(ctx, sent)
    assert store.get_manifest(key) is None
    assert store.get_job(key).state == JobState.FAILED


def test_a_decomposition_rewritten_in_redis_is_not_used(store, ctx):
    board = StageBoard(store, ctx.seal)
    key = _job(store)
    board.put_decomposition(key, {"head": b"{}", "forward": b"fw"}, 600)
    assert board.get_decomposition(key)[b"forward"] == b"fw"
    store.r.hset(f"tf:decomp:{store.ref(key)}", "forward", b"evil")
    assert board.get_decomposition(key) is None
