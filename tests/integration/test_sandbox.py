"""The compile sandbox (workers/sandbox/process.py): a C++ kernel build, driven by a tenant's
graph, runs in a child that holds no secrets, and whatever it does there is bounded.

The probe is a planted compiler: `CXX` names a wrapper that answers Inductor's version
queries with the real g++, and on a real build reports what it could see (the worker's
environment, the signing key file, the record key file, a listening loopback socket,
the worker's /proc environ) and fails the build, so the report comes back in the
compiler's error. The same probe run in the worker's own process (what the tree did
before the sandbox, and what TORCHFARM_SANDBOX=off still does) sees all of it: that
test proves the probe can fail the others.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import stat
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from localfarm.memory_store import memory_store
from tests.requests import relu_request
from torchfarm.fx import vecisa
from torchfarm.fx.cpp_kernels import KernelSpec, spec_args
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.storage.store import JobState
from torchfarm.wire import keys
from torchfarm.wire.codes import JobError
from torchfarm.wire.manifest import blob_digest
from workers import sandbox
from workers.compiler import CompileFailed, build_kernel
from workers.jobs import build
from workers.jobs.sending import kernel_key
from workers.runtime import WorkerContext
from workers.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PASSWORD = "hunter2-redis-password"
SIGNING_KEY = "-----BEGIN PRIVATE KEY----- SIGNING-SECRET"
RECORD_KEY = "RECORD-SEAL-SECRET-0123456789abcdef"
SOURCE = 'extern "C" int torchfarm_sandbox_probe() { return 11; }\n'
BWRAP_OK, BWRAP_WHY = sandbox.bwrap_works()


def _spec(source: str = SOURCE) -> bytes:
    args = spec_args({"main_code": source, "device_type": "cpu", "extra_flags": ()})
    return KernelSpec("CppCodeCache", args, output=0, outputs=1).to_bytes()


def _wrapper(path, body: str) -> str:
    """A `g++` that passes Inductor's queries to the real one and runs `body` on a build."""
    real = shutil.which("g++")
    assert real, "the tests need g++"
    script = textwrap.dedent(f"""\
        #!/bin/sh
        for a in "$@"; do
          case "$a" in --version|-v|-Q|-E|-dumpversion|-dumpfullversion) exec {real} "$@";; esac
        done
        """) + body
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture(autouse=True)
def _isa_probed_with_the_real_compiler():
    """Inductor's vector-ISA probe runs once per process and keeps its answers. Run by a
    fake compiler (CXX: the probe, the hog), it would fail, and every later test in the
    process would pick no ISA and refuse each artifact: so it runs first, for real."""
    vecisa.picked()


@pytest.fixture
def outside_tmp():
    """A directory off /tmp (which the bwrap child sees as an empty tmpfs): files here are
    hidden only by what the sandbox hides on purpose."""
    path = Path(tempfile.mkdtemp(prefix="tf-sandbox-test-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def secrets(outside_tmp, monkeypatch):
    """A worker's secrets, where a real one keeps them: key files, and a Redis URL with
    its password in the environment; plus a loopback port that accepts connections."""
    tmp_path = outside_tmp
    keydir = tmp_path / "keys"
    keydir.mkdir()
    signing, record = keydir / "signing-key.pem", keydir / "record.key"
    signing.write_text(SIGNING_KEY)
    record.write_text(RECORD_KEY)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    monkeypatch.setenv("TORCHFARM_CACHE_URL", f"redis://:{PASSWORD}@127.0.0.1:{port}/1")
    monkeypatch.setenv("TORCHFARM_SIGNING_KEY_FILE", str(signing))
    monkeypatch.setenv("TORCHFARM_RECORD_KEY_FILE", str(record))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", PASSWORD)
    probe = _wrapper(tmp_path / "bin" / "g++", textwrap.dedent(f"""\
        echo PROBE-BEGIN
        echo ENV-BEGIN
        env
        echo ENV-END
        cat {signing} 2>&1
        cat {record} 2>&1
        cat /proc/{os.getpid()}/environ 2>&1 | tr '\\0' '\\n'
        {sys.executable} -c "import socket; s = socket.socket(); print('net', s.connect_ex(('127.0.0.1', {port})))"
        echo PROBE-END
        exit 1
        """))
    monkeypatch.setenv("CXX", probe)
    yield {"signing": str(signing), "record": str(record), "probe": probe}
    listener.close()


def _box(mode: str, secrets: dict, **limits) -> sandbox.Sandbox:
    settings = WorkerSettings(
        signing_key_file=secrets["signing"], record_key_file=secrets["record"], sandbox=mode,
        sandbox_memory_mb=limits.get("memory_mb", 4096), sandbox_headers=False,
    )
    return sandbox.for_worker(settings, mode)


def _probe_report(message: str) -> str:
    assert "PROBE-BEGIN" in message and "PROBE-END" in message, message[-2000:]
    return message[message.index("PROBE-BEGIN"):message.index("PROBE-END")]


def _assert_sees_no_secret(report: str) -> None:
    assert PASSWORD not in report
    assert SIGNING_KEY not in report
    assert RECORD_KEY not in report
    assert "TORCHFARM_CACHE_URL" not in report and "TORCHFARM_SIGNING_KEY_FILE" not in report


@pytest.mark.slow
def test_the_probe_sees_every_secret_in_the_worker_process(secrets, tmp_path):
    """The tree before the sandbox (and TORCHFARM_SANDBOX=off): g++ runs in the process
    holding the keys, and sees them all."""
    from torch._inductor import config
    from torch._inductor.utils import fresh_cache

    with config.patch({"cpp.cxx": (None, secrets["probe"])}), fresh_cache(dir=str(tmp_path)):
        with pytest.raises(CompileFailed) as failed:
            build_kernel(_spec())
    report = _probe_report(str(failed.value))
    assert PASSWORD in report and SIGNING_KEY in report and RECORD_KEY in report
    assert "net 0" in report  # the loopback port (a Redis, in a worker) answered


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bwrap", "process"])
def test_a_sandboxed_build_sees_no_secret(mode, secrets):
    if mode == "bwrap" and not BWRAP_OK:
        pytest.skip(BWRAP_WHY)
    with pytest.raises(sandbox.SandboxFailed) as failed:
        sandbox.build_kernels(_box(mode, secrets), [_spec()], 1, 1 << 30)
    assert failed.value.kind == "compile"
    report = _probe_report(str(failed.value))
    _assert_sees_no_secret(report[report.index("ENV-BEGIN"):report.index("ENV-END")])
    assert "CXX=" in report  # what the compile needs does reach it
    if mode == "bwrap":  # what only the namespaces and the overlays stop
        _assert_sees_no_secret(report)  # the key files read as empty
        assert "net 0" not in report and "net " in report
        assert "TORCHFARM_" not in report  # the worker's /proc environ is out of sight


@pytest.mark.slow
def test_a_sandboxed_build_returns_the_binary(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused"))
    box = sandbox.for_worker(WorkerSettings(sandbox_headers=False), "bwrap" if BWRAP_OK else "process")
    [(binary, seconds)] = sandbox.build_kernels(box, [_spec()], 1, 1 << 30)
    assert binary.startswith(b"\x7fELF") and seconds > 0
    path = tmp_path / "probe.so"
    path.write_bytes(binary)
    import ctypes

    assert ctypes.CDLL(str(path)).torchfarm_sandbox_probe() == 11


def _ctx(box: sandbox.Sandbox) -> WorkerContext:
    return WorkerContext(
        settings=WorkerSettings(max_attempts=2), store=memory_store(),
        fingerprint=local_fingerprint(), name="w0", sandbox=box, send=lambda *a: None,
    )


@pytest.mark.slow
def test_a_build_past_the_memory_limit_fails_its_job_clearly(outside_tmp, monkeypatch):
    """A compiler that allocates 3 GiB under a 2 GiB limit: the child survives it, the
    job ends FAILED with what happened, and the worker process is untouched."""
    hog = _wrapper(outside_tmp / "bin" / "g++", f"{sys.executable} -c 'bytearray(3 << 30)'\nexit 1\n")
    monkeypatch.setenv("CXX", hog)
    box = sandbox.for_worker(WorkerSettings(sandbox_memory_mb=2048, sandbox_headers=False),
                             "bwrap" if BWRAP_OK else "process")
    ctx = _ctx(box)
    key = keys.compute_key(relu_request(), "")
    ctx.store.create_job(key, "cpu.avx2", "test", 600)
    ctx.store.update_job(key, state=JobState.RUNNING, started=1.0)
    spec = _spec()
    digest = blob_digest(spec)
    ctx.store.put_blob(digest, spec)
    target = "cpu:avx2"
    kernels = [[kernel_key(ctx, spec, target), digest]]
    build.run_kernel_batch(key, ctx, "", target, kernels)
    job = ctx.store.get_job(key)
    assert job.state == JobState.FAILED and job.error_code == JobError.COMPILE_ERROR
    assert "memory limit (2048 MiB)" in job.message and "MemoryError" in job.message


def test_the_child_environment_is_an_allow_list(tmp_path):
    env = sandbox.child_env(
        {"PATH": "/bin", "TORCHFARM_CACHE_URL": "redis://:pw@h", "REDIS_PASSWORD": "pw",
         "AWS_SECRET_ACCESS_KEY": "x", "TORCHINDUCTOR_MAX_AUTOTUNE": "1", "CXX": "g++",
         "TORCHINDUCTOR_CACHE_DIR": "/var/cache/inductor"},
        str(tmp_path),
    )
    assert env["PATH"] == "/bin" and env["CXX"] == "g++" and env["TORCHINDUCTOR_MAX_AUTOTUNE"] == "1"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path) and env["HOME"].startswith(str(tmp_path))
    assert not {"TORCHFARM_CACHE_URL", "REDIS_PASSWORD", "AWS_SECRET_ACCESS_KEY"} & set(env)


def test_bwrap_asked_for_and_missing_stops_the_worker(monkeypatch, caplog):
    monkeypatch.setattr(sandbox.process.shutil, "which", lambda name: None)
    with pytest.raises(sandbox.SandboxUnavailable, match="bubblewrap"):
        sandbox.resolve("bwrap")
    assert sandbox.resolve("auto") == "process"
    assert "DEGRADED" in caplog.text
    with pytest.raises(ValueError, match="TORCHFARM_SANDBOX"):
        WorkerSettings(sandbox="chroot")


@pytest.mark.parametrize("result, files", [
    ('{"files": ["../../etc/passwd"]}', {}),
    ('{"files": ["link"]}', {"link": None}),
    ('{"files": ["big"]}', {"big": b"x" * 2048}),
    ('{"error": {"kind": "ok", "message": "x"}}', {}),
    ('[1, 2]', {}),
    ('not json', {}),
])
def test_a_malformed_child_result_is_refused(tmp_path, result, files):
    (tmp_path / "out").mkdir()
    (tmp_path / sandbox.RESULT_FILE).write_text(result)
    for name, data in files.items():
        if data is None:
            (tmp_path / "out" / name).symlink_to("/etc/passwd")
        else:
            (tmp_path / "out" / name).write_bytes(data)
    with pytest.raises(sandbox.SandboxFailed) as failed:
        sandbox.protocol.read_outputs(str(tmp_path), 1024)
    assert failed.value.kind == "crash"


def test_an_out_directory_that_is_a_link_is_never_read(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "payload.bin").write_bytes(b"not the child's")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "out").symlink_to(elsewhere, target_is_directory=True)
    (scratch / sandbox.RESULT_FILE).write_text('{"files": ["payload.bin"]}')
    with pytest.raises(sandbox.SandboxFailed, match="not a plain directory"):
        sandbox.protocol.read_outputs(str(scratch), 1024)


def test_the_registration_says_where_compiles_run():
    store = memory_store()
    store.heartbeat("w0", ["cpu"], "b", 30, sandbox="process")
    assert store.live_workers()["w0"]["sandbox"] == "process"


def test_a_stack_worker_builds_in_the_sandbox_by_default(tmp_path, monkeypatch):
    """A local stack's worker, left to its default (TORCHFARM_SANDBOX=auto; the test
    suite's own stacks run with it off, tests/conftest.py), picks bubblewrap where it
    runs, and says so in its registration."""
    from localfarm.stack import LocalStack

    monkeypatch.delenv("TORCHFARM_SANDBOX", raising=False)
    with LocalStack(workers=1, workdir=tmp_path / "stack", warmup=False) as stack:
        registered = stack.store().live_workers()
    assert registered
    assert {w.get("sandbox") for w in registered.values()} == {"bwrap" if BWRAP_OK else "process"}


@pytest.mark.slow
def test_a_whole_graph_compile_in_the_sandbox_matches_eager(monkeypatch, tmp_path):
    """TORCHFARM_PIPELINE=whole (and max-autotune's fallback to it): the child decodes
    and compiles the request; the pool process signs what it returned, and the artifact
    loads and computes what eager does."""
    import torch

    from sdk import artifact
    from torchfarm.trust.signing import Signer, TrustedKeys
    from workers import runtime
    from workers.jobs.graph import run_job

    monkeypatch.setattr(runtime, "check_build", lambda request, local: None)
    signer = Signer.generate()
    box = sandbox.for_worker(WorkerSettings(), "bwrap" if BWRAP_OK else "process")
    ctx = dataclasses.replace(
        _ctx(box), settings=WorkerSettings(pipeline="whole"), signer=signer, send=None,
    )
    request = relu_request()
    key = keys.compute_key(request, "")
    # Records that outlive a slow compile on a loaded machine: one that expired mid-run
    # was gone when the test read it.
    ctx.store.put_request(key, request.SerializeToString(), 900)
    ctx.store.create_job(key, "cpu", "test", 900)
    run_job(key, ctx, "")
    job = ctx.store.get_job(key)
    assert job.state == JobState.SUCCEEDED, job.message
    manifest = ctx.store.get_manifest(key)
    assert manifest is not None and manifest.kernels
    TrustedKeys.parse(signer.trusted_entry()).verify(
        manifest, key=key, tenant="", fingerprint=ctx.fingerprint.to_dict()
    )
    refs = [manifest.payload, *(r for k in manifest.kernels for r in (k.source, k.binary))]
    blobs = {r.digest: ctx.store.get_blob(r.digest) for r in refs}
    from torch._inductor.utils import fresh_cache

    with fresh_cache(dir=str(tmp_path)):
        compiled = artifact.load(manifest, blobs)
        x = torch.randn(4)
        out = compiled(x)
    torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, torch.relu(x))


# The forkserver (workers/sandbox/process.py's `Forkserver`): every run forks from one child that
# has imported torch and built Inductor's headers. Its planted g++ acts on a marker in
# the kernel's source, so one server (whose environment, CXX included, is fixed when it
# starts) serves runs that do different things; other sources it builds for real.
SLEEPER = "301.5"
"""The argument of the `sleep` a run leaves behind: how the next run finds it."""


def _marked(marker: str) -> bytes:
    return _spec(f"// {marker}\n{SOURCE}")


def _kernel_spec(source: str = SOURCE) -> bytes:
    """A spec of the code cache Inductor's CPU kernels use, the one whose builds include
    the precompiled prefix header (`CppCodeCache` includes none)."""
    args = spec_args({"main_code": source, "device_type": "cpu", "extra_flags": (), "needs_vec_isa": False})
    return KernelSpec("CppPythonBindingsCodeCache", args, output=0, outputs=1).to_bytes()


@pytest.fixture
def planted(outside_tmp, monkeypatch):
    real = shutil.which("g++")
    script = textwrap.dedent(f"""\
        #!/bin/sh
        src=""
        for a in "$@"; do
          case "$a" in --version|-v|-Q|-E|-dumpversion|-dumpfullversion) exec {real} "$@";; esac
          case "$a" in *.cpp) src="$a";; esac
          if [ "$a" = c++-header ]; then
            case "$TMPDIR" in */tfjob-*) echo "HEADER-BUILT-IN-A-RUN"; exit 1;; esac
          fi
        done
        root=$(dirname "$TMPDIR")
        if [ -n "$src" ] && grep -q LEAVE "$src"; then
          setsid sleep {SLEEPER} </dev/null >/dev/null 2>&1 &
          sleep {SLEEPER} </dev/null >/dev/null 2>&1 &
          touch /tmp/left /dev/shm/left "$root/left"
          exit 1
        fi
        if [ -n "$src" ] && grep -q LOOK "$src"; then
          echo REPORT-BEGIN
          for c in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < "$c" 2>/dev/null; echo; done | grep -c "sleep {SLEEPER.replace('.', '[.]')}"
          ls /tmp/left /dev/shm/left "$root/left" 2>&1
          echo REPORT-END
          exit 1
        fi
        if [ -n "$src" ] && grep -q TAMPER "$src"; then
          for h in "$root"/headers/*/*.h "$root"/headers/*.h; do
            [ -f "$h" ] && echo '#error TAMPERED' >> "$h" && : > "$h.gch"
          done
          exit 1
        fi
        if [ -n "$src" ] && grep -q HANG "$src"; then sleep 120; fi
        exec {real} "$@"
        """)
    path = outside_tmp / "planted" / "g++"
    path.parent.mkdir()
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CXX", str(path))
    return path


def _served(mode: str, headers: bool = False) -> sandbox.Sandbox:
    """A worker's sandbox; its server prebuilds the headers only where a test needs them."""
    if mode == "bwrap" and not BWRAP_OK:
        pytest.skip(BWRAP_WHY)
    box = sandbox.for_worker(WorkerSettings(sandbox=mode, sandbox_headers=headers), mode)
    assert box.forkserver is not None
    return box


def _fails(box: sandbox.Sandbox, spec: bytes) -> str:
    with pytest.raises(sandbox.SandboxFailed) as failed:
        sandbox.build_kernels(box, [spec], 1, 1 << 30)
    return str(failed.value)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bwrap", "process"])
def test_runs_fork_from_one_server_that_built_the_headers(mode, planted, tmp_path):
    """Both runs are served by the same server, and neither builds Inductor's header
    (the planted g++ fails a header build in a run): the server's serves them."""
    box = _served(mode, headers=True)
    try:
        for source in (SOURCE, SOURCE.replace("11", "12")):
            [(binary, _)] = sandbox.build_kernels(box, [_kernel_spec(source)], 1, 1 << 30)
            assert binary.startswith(b"\x7fELF")
        assert box.forkserver.runs == 2
        path = tmp_path / "k.so"
        path.write_bytes(binary)
        import ctypes

        assert ctypes.CDLL(str(path)).torchfarm_sandbox_probe() == 12
    finally:
        box.close()


@pytest.mark.slow
def test_a_run_leaves_no_process_and_no_file_for_the_next(planted):
    """A run's compiler leaves two processes (one in a session of its own) and files in
    /tmp, /dev/shm and the server's directory; the next run, forked from the same
    server, finds none of them."""
    box = _served("bwrap")
    try:
        assert "compile" in _fails(box, _marked("LEAVE"))
        pid = box.forkserver.pid
        message = _fails(box, _marked("LOOK"))
        assert box.forkserver.pid == pid
    finally:
        box.close()
    report = message[message.index("REPORT-BEGIN"):message.index("REPORT-END")].split()
    assert report[1] == "0", message  # no `sleep` left
    assert report.count("No") == 3, message  # ls: cannot access each of the three


@pytest.mark.slow
def test_a_process_mode_run_leaves_no_process_in_its_group(planted):
    box = _served("process")
    try:
        _fails(box, _marked("LEAVE"))
        alive = [int(p.name) for p in Path("/proc").glob("[0-9]*")
                 if _cmdline(p) == f"sleep {SLEEPER}" and _alive(int(p.name))]
        # The one left in the run's group is gone; the one that made a session of its own
        # is not (process mode is degraded: docs/security.md).
        [survivor] = alive
        assert os.getsid(survivor) == survivor
    finally:
        box.close()
        for p in Path("/proc").glob("[0-9]*"):
            if _cmdline(p) == f"sleep {SLEEPER}":
                os.kill(int(p.name), 9)
        for left in ("/tmp/left", "/dev/shm/left"):  # this mode has no private /tmp to drop them
            Path(left).unlink(missing_ok=True)


def _kill_tree(pid: int) -> None:
    """Kills `pid` and every process under it (bwrap and the server inside it)."""
    for p in _tree(pid):
        try:
            os.kill(p, 9)
        except ProcessLookupError:
            pass


def _cmdline(proc: Path) -> str:
    try:
        return proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


@pytest.mark.slow
def test_a_run_that_changes_the_prebuilt_headers_ends_the_server(planted):
    """A run rewrites the server's prebuilt headers (the next tenant's kernels would
    include them); the server notices after the run and ends, and the next run gets a
    fresh server whose headers are its own."""
    box = _served("bwrap", headers=True)
    try:
        _fails(box, _marked("TAMPER"))
        first = box.forkserver.pid
        [(binary, _)] = sandbox.build_kernels(box, [_kernel_spec()], 1, 1 << 30)
        assert binary.startswith(b"\x7fELF")
        assert box.forkserver.pid != first
    finally:
        box.close()


@pytest.mark.slow
def test_a_run_past_the_wall_limit_is_killed_and_the_next_is_served(planted):
    box = _served("bwrap" if BWRAP_OK else "process")
    box = dataclasses.replace(box, limits=dataclasses.replace(box.limits, wall_s=5.0))
    try:
        box.forkserver.start(box)
        box.forkserver.root(box)  # ready: the limit is the run's, not the start's
        failed = _fails(box, _marked("HANG"))
        assert "wall limit (5s)" in failed
        [(binary, _)] = sandbox.build_kernels(box, [_spec()], 1, 1 << 30)
        assert binary.startswith(b"\x7fELF") and box.forkserver.runs == 1
    finally:
        box.close()


@pytest.mark.slow
@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "dying-as-the-run-is-sent"])
def test_a_server_that_died_between_runs_is_started_again(planted, reaped):
    box = _served("bwrap" if BWRAP_OK else "process")
    try:
        sandbox.build_kernels(box, [_spec()], 1, 1 << 30)
        _kill_tree(box.forkserver.pid)
        while reaped and box.forkserver.pid is not None:
            time.sleep(0.05)
        [(binary, _)] = sandbox.build_kernels(box, [_spec()], 1, 1 << 30)
        assert binary.startswith(b"\x7fELF") and box.forkserver.runs == 1
    finally:
        box.close()


@pytest.mark.slow
def test_the_server_ends_with_the_worker_process(tmp_path):
    """A worker killed outright leaves no server behind, nor its files: the server's
    stdin ends, and it exits (with bwrap, no --die-with-parent ties it to one thread of
    the worker) and removes what it wrote."""
    import subprocess

    script = textwrap.dedent(f"""\
        import sys
        from tests.integration.test_sandbox import _spec
        from workers import sandbox
        from workers.settings import WorkerSettings
        box = sandbox.for_worker(WorkerSettings(sandbox_headers=False), {"'bwrap'" if BWRAP_OK else "'process'"})
        sandbox.build_kernels(box, [_spec()], 1, 1 << 30)
        print(box.forkserver.pid, box.forkserver.directory, flush=True)
        sys.stdin.read()
        """)
    worker = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              cwd=Path(__file__).resolve().parents[2], text=True)
    try:
        pid, directory = worker.stdout.readline().split()
        server = int(pid)
        tree = _tree(server)
        assert os.listdir(directory)
        # bwrap and the server under it; in "process" mode the server alone, its runs over.
        assert len(tree) >= (2 if BWRAP_OK else 1) and all(_alive(p) for p in tree)
    finally:
        worker.kill()
        worker.wait()
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in tree if _alive(p)]
    # What it built and wrote is gone with it (under bwrap the empty mount point stays).
    assert not os.path.exists(directory) or os.listdir(directory) == []
    shutil.rmtree(directory, ignore_errors=True)


def _tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat_file.parent.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
def test_the_server_imports_the_installed_op_modules_before_its_runs(outside_tmp, monkeypatch):
    """The worker's custom-op modules (transformers' by default: seconds to import) are
    imported once, by the forkserver before its first run: a run forks with them loaded,
    and its `use_installed` finds them there."""
    marker = outside_tmp / "imports.txt"
    (outside_tmp / "tf_marker_ops.py").write_text(
        f"import os\nwith open({str(marker)!r}, 'a') as f:\n    f.write(str(os.getpid()) + '\\n')\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(outside_tmp), os.environ.get("PYTHONPATH")])))
    settings = WorkerSettings(sandbox="process", sandbox_headers=False, installed_op_modules=("tfmarker=tf_marker_ops",))
    box = sandbox.for_worker(settings, "process")
    try:
        for source in (SOURCE, SOURCE.replace("11", "12")):
            sandbox.build_kernels(box, [_kernel_spec(source)], 1, 1 << 30)
        assert box.forkserver is not None and box.forkserver.runs == 2
        assert marker.read_text().split() == [str(box.forkserver.pid)]
    finally:
        box.close()
