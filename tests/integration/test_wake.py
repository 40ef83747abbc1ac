"""A client that submits before any worker of its target is up waits for one (sdk/wake.py)
instead of compiling locally: the farm starts with no worker, the client's submit is
answered NO_WORKER, a worker starts, and the graph is compiled by the farm."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

import sdk
from examples.models import make_mlp
from localfarm.stack import LocalStack
from sdk import report

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]


class _Seen(logging.Handler):
    def __init__(self, text: str):
        super().__init__(logging.WARNING)
        self.text, self.event = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def test_a_client_waits_for_a_worker_that_starts_after_its_submit(tmp_path, monkeypatch, client_cache_dir):
    waiting = _Seen("waiting up to")
    logging.getLogger("sdk.wake").addHandler(waiting)
    env = {"TORCHFARM_WARMUP": "0"}
    try:
        with LocalStack(workers=0, workdir=tmp_path / "farm", extra_env=env) as stack:
            for name, value in stack.client_env().items():
                monkeypatch.setenv(name, value)
            monkeypatch.setenv("TORCHFARM_WAKE_TIMEOUT_S", "300")
            box: dict = {}

            def client():
                try:
                    model, (x,) = make_mlp()
                    with report.collect() as graphs, torch.no_grad():
                        got = sdk.compile(model, remote=stack.address, fallback="error")(x)
                    torch.testing.assert_close(got, model(x), atol=1e-5, rtol=1e-5)
                    box["outcomes"] = [g.outcome for g in graphs]
                except BaseException as e:  # surfaced in the main thread
                    box["error"] = e

            t = threading.Thread(target=client, daemon=True)
            t.start()
            assert waiting.event.wait(120), "the client never reported waiting for a worker"
            assert t.is_alive(), box
            stack.start_worker(0)
            t.join(600)
            assert not t.is_alive(), "the client is still waiting"
            assert "error" not in box, box.get("error")
            assert box["outcomes"] == [report.COMPILED]
    finally:
        logging.getLogger("sdk.wake").removeHandler(waiting)
