"""A training job's machine as docs/sdk.md sets one up, against the farm `torchfarm up`
starts, all as real processes: the client is this checkout installed with
`pip install '<checkout>[sdk]'` in a second venv at another path (no Triton, no
constraints file), configured with nothing but the address a user types
(`grpc://localhost:PORT`; `up` publishes its key for 127.0.0.1). And what such a client
says about where each graph was compiled: one line per graph, each fallback with its
reason, a tally at exit, the farm's record in TORCH_TRACE.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from localfarm.stack import free_port
from tests.second_venv import VenvUnavailable, second_venv

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]

CLIENT = textwrap.dedent(
    """
    import logging, sys
    import torch
    import sdk
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logging.getLogger("sdk").addHandler(handler)
    logging.getLogger("sdk").setLevel(logging.INFO)
    torch.manual_seed(0)
    width = int(sys.argv[1])
    model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.GELU(), torch.nn.Linear(width, 2))
    x = torch.randn(4, 8)
    compiled = sdk.compile(model, fallback=sys.argv[2])
    loss = compiled(x).pow(2).mean()
    loss.backward()
    torch.testing.assert_close(loss, model(x).pow(2).mean())
    print("ok")
    """
)

BROKEN = textwrap.dedent(
    """
    import logging, sys
    import torch
    import sdk
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logging.getLogger("sdk").addHandler(handler)
    logging.getLogger("sdk").setLevel(logging.INFO)

    def fn(x):
        y = torch.relu(x) * 2
        torch._dynamo.graph_break()
        return torch.sin(y) + 1

    x = torch.randn(8)
    torch.testing.assert_close(sdk.compile(fn)(x), fn(x))
    print("ok")
    """
)


def _client_env(config: Path, tmp: Path, **extra: str) -> dict[str, str]:
    """What a user's shell has: no TORCHFARM_* pins, this user's config dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHFARM_", "TORCH_TRACE"))}
    return {
        **env, "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str(config),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), **extra,
    }


def _run(python: str, code: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def client_python() -> str:
    try:
        python = second_venv()
    except VenvUnavailable as e:
        pytest.skip(f"cannot build a second virtualenv here: {e}")
    return str(python)


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    """`torchfarm up` with one worker, publishing its key in a config dir of its own."""
    config = tmp_path_factory.mktemp("config")
    out = tmp_path_factory.mktemp("up") / "stdout"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFARM_")}
    env.update({"PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str(config), "TORCHFARM_WARMUP": "0"})
    with open(out, "w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "up", "--grpc-port", str(port), "--workers", "1"],
            stdout=stdout, stderr=subprocess.DEVNULL, env=env, text=True,
        )
    try:
        deadline = time.monotonic() + 180
        while "farm ready" not in out.read_text():
            assert proc.poll() is None, f"torchfarm up exited: {out.read_text()}"
            assert time.monotonic() < deadline, "torchfarm up did not get ready"
            time.sleep(0.5)
        yield port, config
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_plain_install_asks_for_the_sdk_extra_by_name():
    try:
        python = str(second_venv(extras=()))
    except VenvUnavailable as e:
        pytest.skip(f"cannot build a second virtualenv here: {e}")
    proc = subprocess.run(
        [python, "-c", "import sdk; sdk.compile(lambda x: x)"],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 1
    assert "pip install 'torchfarm[sdk]'" in proc.stderr and "ModuleNotFoundError" not in proc.stderr, proc.stderr


def test_the_sdk_extra_alone_compiles_on_the_farm_up_started(up, client_python, tmp_path):
    port, config = up
    has_triton = subprocess.run(
        [client_python, "-c", "import importlib.util as u; print(u.find_spec('triton') is not None)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert has_triton == "False", "the [sdk] venv must be a client without Triton"
    assert importlib.util.find_spec("triton") is not None, "the farm's own venv has Triton"
    width = str(16 + os.getpid() % 1000)  # a graph no earlier run compiled: a miss
    env = _client_env(config, tmp_path / "a", TORCHFARM_REMOTE=f"grpc://localhost:{port}")

    first = _run(client_python, CLIENT, [width, "error"], env)
    assert first.returncode == 0 and first.stdout.strip() == "ok", first.stderr[-3000:]
    farm = [line for line in first.stderr.splitlines() if "graph 1 of Sequential (<string>:13): miss" in line]
    assert len(farm) == 1 and " key=" in farm[0], first.stderr[-3000:]
    assert "1 graphs in this process: 1 from the farm (0 hits, 1 compiled), 0 compiled locally, 0 eager" \
        in first.stderr, first.stderr[-3000:]
    # torch warns on every run where numpy is missing; `[sdk]` installs it.
    assert "Failed to initialize NumPy" not in first.stderr, first.stderr[-3000:]

    trace_dir = tmp_path / "trace"
    second = _run(client_python, CLIENT, [width, "error"],
                  _client_env(config, tmp_path / "b", TORCHFARM_REMOTE=f"grpc://localhost:{port}",
                              TORCH_TRACE=str(trace_dir)))
    assert second.returncode == 0, second.stderr[-3000:]
    hit = [line for line in second.stderr.splitlines() if "graph 1 of Sequential (<string>:13): hit" in line]
    assert len(hit) == 1, second.stderr[-3000:]
    key = hit[0].split(" key=")[1].split()[0]
    records = _trace_artifacts(trace_dir)
    assert [r["where"] for r in records] == ["farm"] and records[0]["outcome"] == "hit"
    assert records[0]["key"].startswith(key) and records[0]["farm"] == f"localhost:{port}"

    # The CLI's client commands run from the same install, without the server packages.
    status = subprocess.run([str(Path(client_python).parent / "torchfarm"), "status", "--remote",
                             f"grpc://localhost:{port}"], capture_output=True, text=True, timeout=120, env=env)
    assert status.returncode == 0 and "WORKER" in status.stdout, status.stderr[-3000:]


def _trace_artifacts(trace_dir: Path) -> list[dict]:
    """The payloads of this farm's `artifact` entries in a TORCH_TRACE directory, as tlparse
    reads them: a JSON line with `artifact.name`, then its payload lines, tab-indented."""
    found = []
    for path in trace_dir.glob("*.log"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if '"torchfarm_graph"' not in line:
                continue
            meta = json.loads(line[line.index("{"):])
            assert meta["artifact"] == {"name": "torchfarm_graph", "encoding": "json"}
            assert "frame_id" in meta  # attached to the compile that captured the graph
            payload = []
            for more in lines[i + 1:]:
                if not more.startswith("\t"):
                    break
                payload.append(more[1:])
            found.append(json.loads("\n".join(payload)))
    return found


def test_every_graph_says_where_it_was_compiled_when_the_farm_is_down(tmp_path):
    env = _client_env(tmp_path / "config", tmp_path, TORCHFARM_REMOTE=f"grpc://localhost:{free_port()}",
                      TORCHFARM_CONNECT_TIMEOUT_S="1")
    proc = _run(sys.executable, BROKEN, [], env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    warnings = [line for line in lines if line.startswith("WARNING sdk.backend")]
    assert len(warnings) == 1 and "FarmUnavailable" in warnings[0], lines  # once, not per graph
    local = [line for line in lines if "compiled locally in" in line]
    assert [line.split(": compiled")[0].split("torchfarm: ")[1] for line in local] == [
        "graph 1 of fn (<string>:16)", "graph 2 of fn (<string>:16)"], lines  # the script's line
    assert all("FarmUnavailable" in line and "did not answer" in line for line in local), local
    assert "2 graphs in this process: 0 from the farm (0 hits, 0 compiled), 2 compiled locally, 0 eager" \
        in proc.stderr, lines


def test_with_no_farm_configured_sdk_compile_says_so(tmp_path):
    proc = _run(sys.executable, BROKEN, [], _client_env(tmp_path / "config", tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # A warning, so it shows at Python's default level: the farm the user meant to use is not in play.
    assert "WARNING sdk.backend torchfarm: no farm configured (remote= or TORCHFARM_REMOTE): fn (<string>:16) " \
        "and any other model compile locally" in proc.stderr, proc.stderr
    assert proc.stderr.count("(no farm configured)") == 2, proc.stderr
