"""`torchfarm` as a user meets it when something is wrong: one line on stderr and a
non-zero exit status, never a traceback; `--version`; every default in `--help`.

Each test runs the real command, as a process, against nothing (a port with no server)."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

import pytest

from cli.main import build_parser
from cli.parser import _shown

_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchfarm")
TORCHFARM = [_SCRIPT] if os.path.exists(_SCRIPT) else [sys.executable, "-m", "cli"]
"""The installed command; the module where the checkout is not installed (the second
torch build's venv runs the tests from PYTHONPATH)."""


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*TORCHFARM, *args], capture_output=True, text=True, timeout=120, **kwargs)


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_line_error(out: subprocess.CompletedProcess, prog: str) -> str:
    assert out.returncode not in (0, None), out
    assert "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if not line[:4].isdigit()]  # log lines aside
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: "), out.stderr
    return lines[0]


def test_version():
    out = run("--version")
    try:
        expected = version("torchfarm")
    except PackageNotFoundError:  # run from PYTHONPATH, not installed
        expected = "unknown (not installed)"
    assert out.returncode == 0 and out.stdout.strip() == f"torchfarm {expected}"


def test_cache_gc_without_a_reachable_redis():
    port = closed_port()
    out = run("cache", "gc", "--dry-run", "--cache-url", f"redis://127.0.0.1:{port}/1")
    line = one_line_error(out, "torchfarm cache gc")
    assert f"127.0.0.1:{port}" in line and "--cache-url" in line
    assert out.returncode == 1


def test_coordinator_with_redis_down():
    url = f"redis://127.0.0.1:{closed_port()}"
    env = {**os.environ, "TORCHFARM_LISTEN": f"127.0.0.1:{closed_port()}", "TORCHFARM_BROKER_URL": url + "/0",
           "TORCHFARM_CACHE_URL": url + "/1", "TORCHFARM_STATE_URL": url + "/1", "TORCHFARM_METRICS_PORT": "0"}
    line = one_line_error(run("coordinator", env=env), "torchfarm coordinator")
    assert "Redis" in line and "refused" in line


def test_up_on_a_port_in_use():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run("up", "--grpc-port", str(port))
    line = one_line_error(out, "torchfarm up")
    assert f"port {port}" in line and "--grpc-port" in line


def test_a_reader_that_went_away_is_no_error():
    """`torchfarm token bob | head -1`: the pipe's reader is gone before the command writes."""
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run([*TORCHFARM, "token", "bob"], stdout=write, stderr=subprocess.PIPE,
                             text=True, timeout=60)
    finally:
        os.close(write)
    assert out.stderr == "" and out.returncode == 141  # as a shell reports SIGPIPE


def test_a_farm_that_is_unreachable():
    out = run("cache", "ls", "--remote", f"grpc://127.0.0.1:{closed_port()}", "--timeout", "2")
    line = one_line_error(out, "torchfarm cache ls")
    assert "UNAVAILABLE" in line and "is the farm running?" in line


def test_explain_says_an_unreachable_farm_once():
    out = run("explain", "0123456789ab", "--remote", f"grpc://127.0.0.1:{closed_port()}", "--timeout", "2")
    assert "UNAVAILABLE" in one_line_error(out, "torchfarm explain")


def test_a_malformed_token_is_refused_before_any_call():
    """As the SDK refuses it: before, `torchfarm status` said all was well with a token
    every training script would be refused for."""
    out = run("status", "--remote", f"grpc://127.0.0.1:{closed_port()}",
              env={**os.environ, "TORCHFARM_TOKEN": "garbage"})
    assert "TORCHFARM_TOKEN: not a torchfarm token" in one_line_error(out, "torchfarm status")
    assert out.returncode == 2


def test_tls_to_a_plain_farm_is_one_line_that_says_what_to_change():
    """Before, gRPC's C-core printed each failed handshake on stderr as well."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        out = run("status", "--remote", f"grpcs://127.0.0.1:{port}")
    finally:
        server.stop(None)
    line = one_line_error(out, "torchfarm status")
    assert "UNAVAILABLE" in line and "use grpc://" in line and "Handshake failed" not in out.stderr


def test_warm_says_where_a_remote_given_after_the_script_went():
    env = {k: v for k, v in os.environ.items() if k != "TORCHFARM_REMOTE"}
    out = run("warm", "train.py", "--remote", "grpc://127.0.0.1:1", env=env)
    line = one_line_error(out, "torchfarm warm")
    assert "--remote after the script is the script's own argument: put it before" in line
    assert out.returncode == 2


@pytest.mark.parametrize("key", ["abc", "zz12345678", "0123456789abcdefg"])
def test_explain_refuses_what_cannot_be_a_key_prefix(key):
    out = run("explain", key, "--remote", f"grpc://127.0.0.1:{closed_port()}")
    assert "8+ hex digits" in one_line_error(out, "torchfarm explain")
    assert out.returncode == 2


def test_bad_age_is_a_usage_error():
    out = run("cache", "gc", "--grace", "soon", "--cache-url", f"redis://127.0.0.1:{closed_port()}/1")
    assert "not an age" in one_line_error(out, "torchfarm cache gc") and out.returncode == 2


@pytest.mark.parametrize(("args", "says"), [
    (("up", "--grpc-port", "99999"), "--grpc-port: 99999 is not a port (0 to 65535)"),
    (("up", "--redis-port", "-1"), "--redis-port: -1 is not a port (0 to 65535)"),
    (("up", "--workers", "-1"), "--workers: -1 is not a count of 1 or more"),
    (("up", "--concurrency", "0"), "--concurrency: 0 is not a count of 1 or more"),
    (("worker", "--concurrency", "0"), "--concurrency: 0 is not a count of 1 or more"),
    (("warm", "--steps", "-2", "x.py"), "--steps: -2 is not a count of 0 or more"),
    (("cache", "gc", "--max-bytes", "-1"), "--max-bytes: -1 is not a count of 0 or more"),
])
def test_a_number_out_of_its_range_is_a_usage_error(args, says):
    # It reached the command before: a traceback's last line, or another error first.
    out = run(*args)
    prog = "torchfarm " + " ".join(a for a in args[:2] if not a.startswith("-"))
    assert out.returncode == 2 and out.stderr.startswith(f"usage: {prog}"), out.stderr
    assert f"{prog}: error: argument {says}" in out.stderr, out.stderr


def test_a_stray_argument_is_named_by_its_command():
    # argparse's top-level parser reported it, with the top-level usage.
    out = run("cache", "ls", "--older-than", "3", "days")
    assert out.returncode == 2 and out.stderr.startswith("usage: torchfarm cache ls"), out.stderr
    assert "torchfarm cache ls: error: unrecognized arguments: days" in out.stderr, out.stderr


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_help_shows_every_default():
    """Every option with a default shows it (or says it in words) in its command's help."""
    missing = []
    for path, parser in _parsers(build_parser()):
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if not _shown(action):
                continue
            flag = max(action.option_strings, key=len)
            after = text.split(flag, 2)[-1].split(" --", 1)[0]  # the option's own help
            if "default" not in after:
                missing.append(f"{' '.join(path)} {flag}")
    assert missing == []


def test_up_help_through_the_command():
    out = run("up", "--help")
    assert out.returncode == 0
    assert "(default: 50051)" in out.stdout and "(default: 1)" in out.stdout


_SERVER_ONLY = ("redis", "celery", "kombu", "boto3", "botocore", "grpc_health", "prometheus_client")
"""What the coordinator and worker extras bring and `pip install 'torchfarm[sdk]'` does not."""

_CLIENT_ONLY = f"""
import sys
for name in {_SERVER_ONLY!r}:
    sys.modules[name] = None  # import fails, as in a client's venv
from cli.main import main
sys.argv = ["torchfarm", *sys.argv[1:]]
sys.exit(main())
"""


def client_only(*args: str) -> subprocess.CompletedProcess:
    """The command as a training machine's `[sdk]` install runs it: no server packages."""
    return subprocess.run([sys.executable, "-c", _CLIENT_ONLY, *args], capture_output=True, text=True,
                          timeout=120)


def test_a_client_install_runs_the_client_commands():
    out = client_only("status", "--remote", f"grpc://127.0.0.1:{closed_port()}", "--timeout", "2")
    line = one_line_error(out, "torchfarm status")  # the farm's absence, not a missing package
    assert "UNAVAILABLE" in line and "ModuleNotFoundError" not in out.stderr, out.stderr
    assert client_only("--help").returncode == 0


def test_torchfarm_up_in_a_client_install_names_the_extras_it_needs():
    line = one_line_error(client_only("up", "--grpc-port", str(closed_port())), "torchfarm up")
    assert "torchfarm[all]" in line, line


def test_cache_gc_in_a_client_install_says_it_is_an_operators_command():
    """It reads the farm's Redis itself; before, a client install said ModuleNotFoundError
    and called it a bug."""
    line = one_line_error(client_only("cache", "gc", "--dry-run"), "torchfarm cache gc")
    assert "torchfarm[all]" in line and "Redis" in line and "a bug?" not in line, line
