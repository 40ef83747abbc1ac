"""The global state Dynamo leaves out of its graphs: grad mode, autocast, SDPA backends,
deterministic algorithms.

Dynamo calls its backend under the state the frame began in, and the local backend's
AOTAutograd traces under it: `torch.no_grad()` gets an inference graph (no backward,
nothing saved for one), `torch.autocast` around the call gets its casts, and
`torch.nn.attention.sdpa_kernel` around it picks the attention kernel the
decomposition emits (on CPU, `MATH` gives matmuls and a softmax where the default gives
`_scaled_dot_product_flash_attention_for_cpu`), and `torch.use_deterministic_algorithms`
is kept in the compiled backward, which refuses to run under another. None of it is in
the graph. `record`
writes the caller's state into a request's options on the client; `applied` puts it
back on the worker, around decode and compile, and after them (`preserved`) what the
graph's own helper calls changed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator

import torch

from torchfarm.fx.internals import resolve
from torchfarm.v1 import farm_pb2
from torchfarm.wire import options as farm_options

log = logging.getLogger(__name__)

_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu")


def _autocast_nesting() -> int:
    level = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return level - 1


@contextlib.contextmanager
def preserved() -> Iterator[None]:
    """Puts back the thread-local state Dynamo's helper ops change.

    Decoding (fake propagation) and the compile run `_set_grad_enabled`, `_enter_autocast`,
    `_vmap_increment_nesting`, `torch.func.grad`'s and `jvp`'s helpers and `sdpa_kernel`'s
    switch (`graphcheck.SET_SDPA_KERNEL`) for real. A Dynamo graph balances them, but a
    truncated or hostile one would leave the worker with grad off, autocast on, inside a
    vmap, grad or jvp level, with saved-tensor hooks or forward gradients switched, inside
    a dual level (process-wide: every later `jvp` would fail to enter its own) or with
    SDPA backends off for every later job. `applied` holds a job in it; the decoder, each
    propagation.
    """
    grad = torch.is_grad_enabled()
    sdpa = resolve("sdpa_backends")(with_priority=True)
    autocast = [
        (d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES
    ]
    autocast_cache = torch.is_autocast_cache_enabled()
    autocast_nesting = _autocast_nesting()
    layers = resolve("functorch_depth")()
    saved_tensors_hooks = resolve("saved_tensors_hooks_enabled")()
    inplace_requires_grad = resolve("inplace_requires_grad_allowed")()
    fwd_grad = resolve("fwd_grad_enabled")()
    dual_level = _in_dual_level()
    forward_ad_level = resolve("forward_ad_current_level")
    guard = resolve("GlobalStateGuard")()
    try:
        with resolve("PreserveDispatchKeyGuard")():
            yield
    finally:
        _leave_functorch_levels(layers)
        if _in_dual_level() and not dual_level:
            resolve("exit_dual_level")(level=0)  # the only level there can be
        # forward_ad's Python calls check their own count against the process's level.
        setattr(resolve("forward_ad"), "_current_level", forward_ad_level)  # noqa: B010
        resolve("set_fwd_grad_enabled")(fwd_grad)
        if saved_tensors_hooks:
            resolve("saved_tensors_hooks_enable")()
        resolve("set_inplace_requires_grad_allowed")(inplace_requires_grad)
        resolve("set_grad_enabled")(grad)
        for device, enabled, dtype in autocast:
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)
        torch.set_autocast_cache_enabled(autocast_cache)
        while _autocast_nesting() > autocast_nesting:
            torch.autocast_decrement_nesting()
        resolve("set_sdpa_backends")(sdpa, set_priority=True)
        if not guard.check():
            log.error("global state still differs after the graph ran: %s", guard.reason())


def _leave_functorch_levels(depth: int) -> None:
    """Leaves `torch.func`'s levels down to `depth`, innermost first, each by its own
    kind's call: vmap's, grad's and jvp's, the only ones the allow-list lets a graph
    enter. (torch 2.11's one call for all, `pop_dynamic_layer_stack_and_undo_to_depth`,
    fails its own assertion at depth 0.)"""
    kinds = resolve("functorch_transforms")
    leave = {
        kinds.Vmap: resolve("vmap_decrement_nesting"),
        kinds.Grad: resolve("grad_decrement_nesting"),
        kinds.Jvp: resolve("jvp_decrement_nesting"),
    }
    while resolve("functorch_depth")() > depth:
        leave[resolve("functorch_top")().key()]()


def _in_dual_level() -> bool:
    """Whether the process is inside a forward-mode dual level. Torch keeps one at most,
    for all threads, and has no call that says: entering another fails while one is."""
    try:
        level = resolve("enter_dual_level")()
    except RuntimeError:
        return True
    resolve("exit_dual_level")(level=level)
    return False


def autocast_now() -> list[tuple[str, str]]:
    """(device type, dtype name) of each device type autocast is on for in this thread."""
    return [
        (device, str(torch.get_autocast_dtype(device)).removeprefix("torch."))
        for device in sorted(farm_options.AUTOCAST_DEVICES)
        if torch.is_autocast_enabled(device)
    ]


def sdpa_backends_now() -> list[str]:
    """The SDPA backends enabled, by priority; empty when they are torch's default."""
    names = [b.name for b in resolve("sdpa_backends")(with_priority=True)]
    return [] if tuple(names) == farm_options.SDPA_BACKENDS else names


def record(options: farm_pb2.CompileOptions) -> None:
    """Writes this thread's grad mode, autocast and SDPA backends, and the process's
    deterministic-algorithms setting, into `options`."""
    options.no_grad = not torch.is_grad_enabled()
    del options.autocast[:]
    for device, dtype in autocast_now():
        options.autocast.add(device_type=device, dtype=dtype)
    options.sdpa_backends[:] = sdpa_backends_now()
    options.deterministic = torch.are_deterministic_algorithms_enabled()
    options.deterministic_warn_only = options.deterministic and torch.is_deterministic_algorithms_warn_only_enabled()


@contextlib.contextmanager
def _deterministic(on: bool, warn_only: bool) -> Iterator[None]:
    """`torch.use_deterministic_algorithms(on, warn_only=warn_only)`, the prior setting after."""
    prior = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(on, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prior[0], warn_only=prior[1])


@functools.cache
def _keyed_by() -> type:
    """A post-grad pass that changes nothing: its `uuid` enters Inductor's and
    AOTAutograd's cache keys, which leave the SDPA backends out (torch 2.13), so a warm
    worker never serves a graph it traced under other backends from its own cache.
    Made on first use: the SDK imports this module and needs no Inductor for it."""

    class KeyedBy(resolve("CustomGraphPass")):  # type: ignore[misc]
        def __init__(self, names: list[str]) -> None:
            self.names = names

        def __call__(self, graph: object) -> None:
            return None

        def uuid(self) -> str:
            return "torchfarm-sdpa-backends:" + ",".join(self.names)

    return KeyedBy


@contextlib.contextmanager
def _sdpa_backends(names: list[str]) -> Iterator[None]:
    """The SDPA backends `names` enabled, in that priority; the prior ones after."""
    if not names:
        yield
        return
    from torch.nn.attention import SDPBackend

    prior = resolve("sdpa_backends")(with_priority=True)
    resolve("set_sdpa_backends")([getattr(SDPBackend, n) for n in names], set_priority=True)
    try:
        with resolve("inductor_config").patch(post_grad_custom_post_pass=_keyed_by()(names)):
            yield
    finally:
        resolve("set_sdpa_backends")(prior, set_priority=True)


@contextlib.contextmanager
def applied(options: farm_pb2.CompileOptions) -> Iterator[None]:
    """This thread under the grad mode, autocast, SDPA backends and deterministic
    algorithms `options` records, and the process under its AOTAutograd settings;
    raises OptionNotAllowed for an autocast, backend or setting the farm does not take.

    Autocast is set through its thread-local switches, not `torch.autocast`, which turns
    itself off for a device this machine lacks (a CPU worker lowering for CUDA)."""
    autocast = farm_options.check_autocast([(a.device_type, a.dtype) for a in options.autocast])
    backends = farm_options.check_sdpa_backends(list(options.sdpa_backends))
    # The worker checked every option already (workers/runtime.py); these are AOTAutograd's.
    carried = [(o.name, o.json_value) for o in options.inductor if o.name.startswith(farm_options.FUNCTORCH)]
    _, functorch = farm_options.split_functorch(farm_options.check_options(options.mode, carried))
    prior = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in autocast]
    with (
        preserved(), torch.set_grad_enabled(not options.no_grad), _sdpa_backends(backends),
        _deterministic(options.deterministic, options.deterministic_warn_only),
        resolve("functorch_config").patch(functorch),
    ):
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
