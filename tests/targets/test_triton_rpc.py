"""Through the real parts: redis-server, the gRPC coordinator and a Celery worker started
as `--targets local,cuda:sm_90,cuda:sm_80,rocm:gfx942` on this CPU-only machine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

import sdk
from localfarm.stack import LocalStack
from sdk.triton_client import CompiledKernel
from tests.requests import relu_request
from torchfarm.fx.fingerprint import local_target
from torchfarm.kernels import elf, triton_request
from torchfarm.trust.signing import Signer
from torchfarm.v1 import farm_pb2, farm_pb2_grpc
from torchfarm.wire import builds
from torchfarm.wire.manifest import blob_digest

pytestmark = pytest.mark.integration

KERNEL_FILE = Path(__file__).parent / "kernels" / "add_kernel.py"
SOURCE = KERNEL_FILE.read_text()
SIGNATURE = "*fp32,*fp32,*fp32,i32,constexpr"
ROOT = Path(__file__).resolve().parents[2]
PLANTED = "redis://:planted-h1-secret@cache:6379/0"
"""A credential in the kernel worker's environment; no answer to a client may carry it."""


@pytest.fixture(scope="module")
def gpu_kernel_stack(tmp_path_factory):
    env = {"TORCHFARM_TARGETS": "local,cuda:sm_90,cuda:sm_80,rocm:gfx942", "TORCHFARM_PLANTED_URL": PLANTED}
    s = LocalStack(workers=1, workdir=tmp_path_factory.mktemp("kstack"), extra_env=env, warmup=False)
    s.start(timeout_s=300)  # a loaded shared machine takes a while to start a worker
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def stub(gpu_kernel_stack):
    with grpc.insecure_channel(gpu_kernel_stack.address.removeprefix("grpc://")) as channel:
        yield farm_pb2_grpc.CompileFarmStub(channel)


def test_worker_registers_its_targets_and_queues(gpu_kernel_stack, stub):
    cpu = str(local_target("cpu"))
    (worker,) = stub.GetFarmStatus(farm_pb2.FarmStatusRequest(), timeout=5).workers
    served = {t.target: list(t.jobs) for t in worker.targets}
    assert served == {cpu: ["graph"], "cuda:sm_90": ["kernel"], "cuda:sm_80": ["kernel"], "rocm:gfx942": ["kernel"]}
    build = ".b" + builds.digest(dict(worker.fingerprint))  # graph and stage queues name the build
    assert worker.queue.split(",") == [
        cpu.replace(":", ".") + build, "stages." + cpu.replace(":", ".") + build,
        "kernels.cuda.sm_90", "kernels.cuda.sm_80", "kernels.rocm.gfx942",
    ]
    # Its graph build is a CPU one, which names no Triton; its kernel jobs use its Triton.
    assert worker.fingerprint["triton_version"] == "" and worker.fingerprint["isa"] == local_target("cpu").isa


@pytest.mark.parametrize("target, machine, mach", [
    ("cuda:sm_90", elf.EM_CUDA, 90), ("cuda:sm_80", elf.EM_CUDA, 80), ("rocm:gfx942", elf.EM_AMDGPU, 0x04C),
])
def test_kernel_rpc_returns_a_binary_for_the_arch(gpu_kernel_stack, target, machine, mach):
    k = sdk.compile_kernel(
        SOURCE, "add_kernel", target=target, signature=SIGNATURE, constexprs={"BLOCK": 1024},
        remote=gpu_kernel_stack.address,
    )
    info = elf.inspect_binary(k.binary)
    assert info.machine == machine
    assert (info.flags & 0xFF) == mach or (info.flags >> 8) & 0xFF == mach
    assert k.target == target and k.worker == "cpu0" and not k.cache_hit
    again = sdk.compile_kernel(
        SOURCE, "add_kernel", target=target, signature=SIGNATURE, constexprs={"BLOCK": 1024},
        remote=gpu_kernel_stack.address,
    )
    assert again.cache_hit and again.binary == k.binary and again.key == k.key


def test_a_kernel_record_written_in_redis_does_not_choose_the_clients_code(gpu_kernel_stack):
    """Whoever can write the cache Redis once chose the code a client got: a record that
    named another kernel's binary (valid code for the same arch) was served as this one's."""
    def compile_(block: int) -> CompiledKernel:
        return sdk.compile_kernel(
            SOURCE, "add_kernel", target="cuda:sm_80", signature=SIGNATURE, constexprs={"BLOCK": block},
            remote=gpu_kernel_stack.address,
        )

    honest, other = compile_(512), compile_(128)
    store = gpu_kernel_stack.store()
    name = store._j("kernel", honest.key)
    record = store.c.get(name)
    store.c.set(name, record.replace(blob_digest(honest.binary).encode(), blob_digest(other.binary).encode()))
    again = compile_(512)
    assert again.binary != other.binary
    assert again.binary == honest.binary and not again.cache_hit  # refused, then compiled again


def _error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


def test_unserved_targets_are_failed_precondition_before_the_deadline(stub):
    # A farm that waited for a worker would answer DEADLINE_EXCEEDED at the 5 s deadline.
    gpu_graph = relu_request()
    gpu_graph.target.device, gpu_graph.target.arch = "cuda", "sm_90"  # kernels only here
    err = _error(lambda: stub.Submit(gpu_graph, timeout=5))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "compiles graphs for target cuda:sm_90" in err.details()

    kernel = triton_request.build_kernel_request(
        SOURCE, "add_kernel", target="cuda:sm_100", signature=SIGNATURE, constexprs={"BLOCK": 64},
    )
    err = _error(lambda: stub.CompileKernel(kernel, timeout=5))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "Triton kernels for target cuda:sm_100" in err.details()


def test_rejected_kernels_never_reach_a_worker(stub):
    kernel = triton_request.build_kernel_request(
        SOURCE, "add_kernel", target="cuda:sm_90", signature=SIGNATURE, constexprs={"BLOCK": 64},
    )
    kernel.source = kernel.source.replace("pid = tl.program_id(0)", "pid = getattr(tl, 'core')")
    err = _error(lambda: stub.CompileKernel(kernel, timeout=5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "'getattr'" in err.details()


# Triton folds "_" + "_" into "__" and calls str.format at compile time, so this reaches
# os.environ through a kernel argument's class; its compile error used to come back verbatim.
LEAK = (
    '    s: tl.constexpr = "{0._" + "_class_" + "_._" + "_init_" + "_._" + "_globals_" + "_[inspect].os.environ}"\n'
    "    tl.static_assert(False, s.format(n))\n"
    "    pid = tl.program_id(0)\n"
)


def test_a_kernel_cannot_read_the_workers_environment(stub):
    kernel = triton_request.build_kernel_request(
        SOURCE, "add_kernel", target="cuda:sm_90", signature=SIGNATURE, constexprs={"BLOCK": 64},
    )
    kernel.source = SOURCE.replace("    pid = tl.program_id(0)\n", LEAK)  # past the client's own check
    with pytest.raises(grpc.RpcError) as e:
        stub.CompileKernel(kernel, timeout=120)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "planted-h1-secret" not in e.value.details() and "environ(" not in e.value.details()


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )


def test_cli_writes_no_kernel_the_farm_did_not_sign_with_a_pinned_key(gpu_kernel_stack, tmp_path):
    out = tmp_path / "add.cubin"
    args = ("kernel", "compile", f"{KERNEL_FILE}::add_kernel", "--target", "cuda:sm_80", "--signature",
            SIGNATURE, "--constexpr", "BLOCK=64", "-o", str(out), "--remote", gpu_kernel_stack.address)
    other = ",".join(f"{k}={v}" for k, v in Signer.generate().trusted_entry().items())
    p = _cli(*args, TORCHFARM_TRUSTED_KEYS=other)
    assert p.returncode == 1 and "refused the farm's kernel" in p.stderr and "which is not pinned" in p.stderr, p.stderr
    assert not out.exists()
    p = _cli(*args)  # the stack's own key, from the trust file it published
    assert p.returncode == 0 and out.read_bytes()[:4] == b"\x7fELF", p.stderr


def test_cli_kernel_compile_and_status(gpu_kernel_stack, tmp_path):
    out = tmp_path / "add.hsaco"
    meta = tmp_path / "add.json"
    p = _cli(
        "kernel", "compile", f"{KERNEL_FILE}::add_kernel", "--target", "rocm:gfx942",
        "--signature", "x_ptr=*fp16,y_ptr=*fp16,out_ptr=*fp16,n=i32,BLOCK=constexpr",
        "--constexpr", "BLOCK=256", "--num-warps", "4", "-o", str(out), "--metadata", str(meta),
        "--remote", gpu_kernel_stack.address,
    )
    assert p.returncode == 0, p.stderr
    assert "hsaco for rocm:gfx942 (gfx942)" in p.stdout
    assert elf.check_binary(out.read_bytes(), "rocm", "gfx942").arch == "gfx942"
    assert json.loads(meta.read_text())["num_warps"] == 4

    p = _cli("kernel", "compile", f"{KERNEL_FILE}::add_kernel", "--target", "cpu:avx2",
             "--signature", SIGNATURE, "--constexpr", "BLOCK=256", "--remote", gpu_kernel_stack.address)
    assert p.returncode == 2 and "kernels compile for cuda, rocm targets" in p.stderr

    p = _cli("status", "--remote", gpu_kernel_stack.address)
    assert p.returncode == 0, p.stderr
    rows: dict[str, list[str]] = {}
    for line in p.stdout.splitlines():  # the per-target table comes before the per-build one
        if line.startswith(("cpu:", "cuda:", "rocm:")):
            rows.setdefault(line.split()[0], line.split()[1:3])
    assert re.search(rf"^{local_target('cpu')}\s+torch ", p.stdout, re.M)  # its build's row
    assert rows["cuda:sm_90"] == ["-", "cpu0"] and rows["rocm:gfx942"] == ["-", "cpu0"]
    assert rows[str(local_target("cpu"))] == ["cpu0", "-"]
