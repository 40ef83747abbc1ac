"""Helpers for the tests that drive a real local farm."""

from __future__ import annotations

import textwrap
import time

from services.coordinator.farm import CeleryDispatcher
from tests.requests import relu_request
from torchfarm.storage.store import Store
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys

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
    """A request for this machine's CPU target, built with a torch no worker has. The
    coordinator refuses it at submit (BUILD_NOT_SERVED); `queue_foreign_build_job` puts
    it on a worker's queue anyway, and the worker refuses it at once (BUILD_MISMATCH)."""
    isa = ""
    for worker in store.live_workers().values():
        for target in worker.get("targets", {}):
            device, _, detail = target.partition(":")
            if device == "cpu" and detail:
                isa = detail
    request = relu_request(torch_version=f"0.0.0-{tag}", **({"isa": isa} if isa else {}))
    return request


def queue_foreign_build_job(store: Store, broker_url: str, tag: str, queue: str = "") -> str:
    """Queues a `foreign_build_request` job straight on a local worker's graph queue
    (`queue`, or the first live worker's), as only a hand-named queue or a build-digest
    clash would: the worker refuses it at once with BUILD_MISMATCH, compiling nothing.
    Returns its key."""
    request = foreign_build_request(store, tag)
    if not queue:
        queue = next(
            q for w in store.live_workers().values() for q in w.get("queues", ())
            if not q.startswith(("kernels.", "stages."))
        )
    key = keys.compute_key(request, "")
    store.put_request(key, request.SerializeToString(), 600)
    store.create_job(key, queue, tag, 600)
    CeleryDispatcher(broker_url).send(key, queue)
    return key
