"""The global state Dynamo guards on and leaves out of its graphs: grad mode and autocast.

Dynamo calls its backend under the state the frame began in, and the local backend's
AOTAutograd traces under it: `torch.no_grad()` gets an inference graph (no backward,
nothing saved for one), and `torch.autocast` around the call gets its casts. Neither is
in the graph. `record` writes the caller's state into a request's options on the
client; `applied` puts it back on the worker, around decode and compile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from torchfarm import options as farm_options
from torchfarm.v1 import farm_pb2


def autocast_now() -> list[tuple[str, str]]:
    """(device type, dtype name) of each device type autocast is on for in this thread."""
    return [
        (device, str(torch.get_autocast_dtype(device)).removeprefix("torch."))
        for device in sorted(farm_options.AUTOCAST_DEVICES)
        if torch.is_autocast_enabled(device)
    ]


def record(options: farm_pb2.CompileOptions) -> None:
    """Writes this thread's grad mode and autocast into `options`."""
    options.no_grad = not torch.is_grad_enabled()
    del options.autocast[:]
    for device, dtype in autocast_now():
        options.autocast.add(device_type=device, dtype=dtype)


@contextlib.contextmanager
def applied(options: farm_pb2.CompileOptions) -> Iterator[None]:
    """This thread under the grad mode and autocast `options` records; raises
    OptionNotAllowed for an autocast the farm does not take.

    Autocast is set through its thread-local switches, not `torch.autocast`, which turns
    itself off for a device this machine lacks (a CPU worker lowering for CUDA)."""
    autocast = farm_options.check_autocast([(a.device_type, a.dtype) for a in options.autocast])
    prior = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in autocast]
    with torch.set_grad_enabled(not options.no_grad):
        if not autocast:
            yield
            return
        for device, dtype in autocast.items():
            torch.set_autocast_enabled(device, True)
            torch.set_autocast_dtype(device, getattr(torch, dtype))
        torch.autocast_increment_nesting()
        try:
            yield
        finally:
            if torch.autocast_decrement_nesting() == 0:
                torch.clear_autocast_cache()
            for device, enabled, prior_dtype in prior:
                torch.set_autocast_enabled(device, enabled)
                torch.set_autocast_dtype(device, prior_dtype)
