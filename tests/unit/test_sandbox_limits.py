"""workers/sandbox_limits.py: what the compile sandbox applies per device kind, checked
against what a GPU runtime needs to start (a large PROT_NONE address-space reservation,
its device nodes) and against what the sandbox must still bound."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from workers import sandbox, sandbox_limits
from workers.sandbox import Limits, bwrap_argv
from workers.settings import WorkerSettings


@pytest.mark.parametrize("device", ["cuda", "rocm", "xpu"])
def test_a_gpu_kind_bounds_memory_with_rlimit_data_and_binds_its_nodes(device):
    policy = sandbox_limits.policy_for(device)
    assert policy.memory_rlimit == "data"
    assert {"/dev/nvidia*", "/dev/kfd", "/dev/dri"} <= set(policy.device_nodes)


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_other_kinds_keep_rlimit_as_and_no_device_nodes(device):
    policy = sandbox_limits.policy_for(device)
    assert (policy.memory_rlimit, policy.device_nodes) == ("as", ())


def test_a_workers_sandbox_follows_its_device_kinds_policy(monkeypatch):
    settings = WorkerSettings(sandbox_memory_mb=4096, sandbox_forkserver=False)
    cpu = sandbox.for_worker(settings, "process")
    assert (cpu.limits.memory_kind, cpu.limits.memory_bytes, cpu.devices) == ("as", 4096 << 20, ())
    monkeypatch.setattr(sandbox_limits.glob, "glob",
                        lambda p: {"/dev/nvidia*": ["/dev/nvidia1", "/dev/nvidia0", "/dev/nvidiactl"],
                                   "/dev/dri": ["/dev/dri"]}.get(p, []))
    gpu = sandbox.for_worker(settings, "process", device="cuda")
    assert (gpu.limits.memory_kind, gpu.limits.memory_bytes) == ("data", 4096 << 20)
    assert gpu.devices == ("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/dri")
    argv = bwrap_argv("/scratch", (), devices=gpu.devices)
    # After bwrap's own minimal /dev, or that /dev would cover them.
    assert argv.index("--dev-bind") > argv.index("--dev")
    i = argv.index("/dev/nvidiactl")
    assert argv[i - 1:i + 2] == ["--dev-bind", "/dev/nvidiactl", "/dev/nvidiactl"]


_RESERVE_AND_ALLOCATE = textwrap.dedent("""
    import ctypes, json, sys
    from workers.sandbox import Limits, apply_limits
    apply_limits(Limits(**json.loads(sys.argv[1])))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    # What a CUDA context does as it starts: reserve address space it may never use
    # (PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE), 64 GiB here.
    p = libc.mmap(None, 64 << 30, 0, 0x02 | 0x20 | 0x4000, -1, 0)
    reserved = p not in (None, ctypes.c_void_p(-1).value)
    try:
        grown = bool(bytearray(2 << 30))  # what a runaway compile does: 2 GiB, written
    except MemoryError:
        grown = False
    print(json.dumps({"reserved": reserved, "grown": grown}))
""")


def _under(limits: Limits) -> dict[str, bool]:
    out = subprocess.run([sys.executable, "-c", _RESERVE_AND_ALLOCATE, json.dumps(limits.__dict__)],
                         capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def test_a_gpu_kinds_limit_lets_the_runtime_reserve_and_still_bounds_the_compile():
    gib = 1 << 30
    assert _under(Limits(memory_bytes=gib, memory_kind="data")) == {"reserved": True, "grown": False}
    # The CPU's RLIMIT_AS refuses the reservation: "CUDA error: out of memory" on a GPU.
    assert _under(Limits(memory_bytes=gib, memory_kind="as")) == {"reserved": False, "grown": False}


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_bwrap_binds_the_device_nodes_it_is_given(tmp_path):
    node = "/dev/fuse"  # a character device bwrap's minimal /dev lacks, standing in for /dev/nvidia0
    if not os.path.exists(node):
        pytest.skip(f"{node} is absent here")
    ok, why = sandbox.bwrap_works()
    if not ok:
        pytest.skip(why)
    check = ["sh", "-c", f"test -c {node}"]
    assert subprocess.run(bwrap_argv(str(tmp_path), ()) + check, check=False).returncode != 0
    assert subprocess.run(bwrap_argv(str(tmp_path), (), devices=(node,)) + check, check=False).returncode == 0


_READ_LIMITS = "import json, resource; print(json.dumps([resource.getrlimit(getattr(resource, 'RLIMIT_' + n)) for n in ('AS', 'CPU', 'FSIZE', 'CORE')]))"


def test_a_sandboxed_child_gets_its_limits_with_no_python_run_between_fork_and_exec(tmp_path):
    # preexec_fn runs Python in the forked child of a threaded worker, which the Python
    # documentation calls unsafe: it crashed once, in threading's after-fork hook. The
    # limits now reach the child through its command line, which sets them and execs it.
    box = sandbox.Sandbox(mode="process", limits=Limits(memory_bytes=3 << 30, cpu_s=50, file_bytes=7 << 20))
    argv, env = sandbox.child_command(box, [sys.executable, "-c", _READ_LIMITS], str(tmp_path))
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == [[3 << 30, 3 << 30], [50, 55], [7 << 20, 7 << 20], [0, 0]]


def test_a_command_that_cannot_start_under_its_limits_says_so(tmp_path):
    box = sandbox.Sandbox(mode="process", limits=Limits(cpu_s=50))
    argv, env = sandbox.child_command(box, [str(tmp_path / "missing")], str(tmp_path))
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 127 and "missing" in out.stderr
