"""Helpers for the tests that drive a real local farm."""

from __future__ import annotations

import textwrap
import time

from tests.requests import relu_request
from torchfarm.store import Store
from torchfarm.v1 import farm_pb2


MLP_COMPILE_SCRIPT = textwrap.dedent(
    """
    import torch, sdk
    from examples.models import make_mlp
    model, (x,) = make_mlp()
    compiled = sdk.compile(model, remote={address!r}, fallback="error")
    with torch.no_grad():
        got, want = compiled(x), model(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    print("COMPILED-OK")
    """
)
"""A client script (format it with `address`): one MLP compile through the farm,
checked against eager; prints COMPILED-OK."""


def wait_for(what: str, ok, timeout_s: float = 60.0, every_s: float = 0.2):
    """Polls `ok()` until it returns something true, and returns that."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = ok()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(every_s)


def foreign_build_request(store: Store, tag: str) -> farm_pb2.CompileRequest:
    """A request for this machine's CPU target, built with a torch no worker has: the
    coordinator routes it to the local workers, and the worker refuses it at once
    (BUILD_MISMATCH) without compiling anything."""
    isa = ""
    for worker in store.live_workers().values():
        for target in worker.get("targets", {}):
            device, _, detail = target.partition(":")
            if device == "cpu" and detail:
                isa = detail
    request = relu_request(torch_version=f"0.0.0-{tag}", **({"isa": isa} if isa else {}))
    return request
