"""`sdk.compile(..., wait=False)`: graphs run eagerly while the farm compiles them, and
switch to the compiled code at a step boundary.

For each graph Dynamo hands over, the backend encodes it on the calling thread (the
same request as the blocking path), then returns a `GraphSlot` at once. The slot runs
the graph eagerly (the `GraphModule.forward` Dynamo gave, under autograd as usual)
while a daemon thread submits, watches, fetches, verifies (sdk/artifact.py, exactly as
the blocking path) and loads the artifact.

Step boundary: the start of a call of the object `sdk.compile` returned (a forward
pre-hook on the `OptimizedModule`, or a wrapper around a compiled function). There,
every graph whose compiled callable is ready switches to it, all together. Nothing
switches during a call, so one forward (and the backward autograd records from it)
runs each graph's eager code or its compiled code, never a mix. Calls from several
threads at once are not supported.

Errors in the background never reach the training loop with `fallback="local"`: the
graph keeps running eagerly, with one warning per model (later failures log at INFO;
a farm bug, `FarmBug`, is warned of every time).
No local compile is started: it would compete with training for the CPU, and a
compile on the main thread would stall the steps `wait=False` exists to keep going.
With `fallback="error"`, or an error that never falls back (`ConfigError`), the error
is raised from the next call of the model, once; the graph then stays eager.

The compile threads are daemons: a process that exits with a compile in flight does
not wait for it. `wait_ready(model)` waits for the compiles started so far.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from sdk import outcomes
from sdk.errors import ConfigError, FarmBug, FarmError
from sdk.metrics import FALLBACKS

log = logging.getLogger(__name__)

COMPILING = "compiling"
"""The farm is compiling the graph; it runs eagerly."""
READY = "ready"
"""The compiled callable is loaded; the graph switches at the next step boundary."""
COMPILED = "compiled"
"""The graph runs the farm's compiled code."""
EAGER = "eager"
"""The farm could not serve the graph; it stays eager."""


class GraphSlot:
    """The callable Dynamo gets for one graph: the eager graph until the swap."""

    def __init__(self, index: int, key: str, eager: Callable[..., Any]):
        self.index = index
        self.key = key
        """The farm's cache key for the graph; empty if it was never sent."""
        self._fn = eager
        self.compiled: Callable[..., Any] | None = None
        self.error: BaseException | None = None
        self.eager_calls = 0
        self.compiled_calls = 0
        self.compile_s = 0.0
        """Seconds from the hand-over to the compiled callable being ready (or failing)."""
        self.swapped_at_call = 0
        """The model call (1-based) at whose start the graph switched; 0 if it has not."""
        self.done = threading.Event()
        self._swapped = False

    @property
    def state(self) -> str:
        if self._swapped:
            return COMPILED
        if not self.done.is_set():
            return COMPILING
        return READY if self.compiled is not None else EAGER

    def __call__(self, *args: Any) -> Any:
        if self._swapped:
            self.compiled_calls += 1
        else:
            self.eager_calls += 1
        return self._fn(*args)

    def swap(self, call: int) -> None:
        assert self.compiled is not None
        self._fn = self.compiled
        self._swapped = True
        self.swapped_at_call = call


class Swapper:
    """The graphs of one `sdk.compile(..., wait=False)` model, and their swaps."""

    def __init__(self, name: str, fallback: str):
        self.name = name
        self.fallback = fallback
        self.graphs: list[GraphSlot] = []
        self.calls = 0
        """Calls of the model so far (step boundaries crossed)."""
        self._lock = threading.Lock()
        self._warned = False
        self._to_raise: list[BaseException] = []

    def raises(self, e: BaseException) -> bool:
        """Whether `e` goes to the caller (raised) rather than leaving the graph eager."""
        if isinstance(e, FarmError) and not e.fallback:
            return True
        return self.fallback != "local"

    def defer(
        self, index: int, key: str, eager: Callable[..., Any], work: Callable[[], Callable[..., Any]]
    ) -> GraphSlot:
        """Returns the slot for a graph at once; `work` builds its compiled callable in
        a daemon thread."""
        slot = GraphSlot(index, key, eager)
        with self._lock:
            self.graphs.append(slot)
        thread = threading.Thread(
            target=self._compile, args=(slot, work), name=f"torchfarm-graph-{index}", daemon=True
        )
        thread.start()
        return slot

    def failed(self, index: int, eager: Callable[..., Any], e: FarmError) -> GraphSlot:
        """A graph that could not even be sent: raised, or eager for good."""
        if self.raises(e):
            raise e
        slot = GraphSlot(index, "", eager)
        slot.error = e
        slot.done.set()
        with self._lock:
            self.graphs.append(slot)
        self._report(slot, e)
        return slot

    def _compile(self, slot: GraphSlot, work: Callable[[], Callable[..., Any]]) -> None:
        t0 = time.perf_counter()
        try:
            slot.compiled = work()
        except BaseException as e:  # noqa: BLE001 - nothing may escape a daemon thread unseen
            slot.error = e
            if self.raises(e):
                with self._lock:
                    self._to_raise.append(e)
                log.error("torchfarm: graph %d of %s key=%s failed; raised at the next call "
                          "of the model: %s", slot.index, self.name, slot.key[:12], e)
            else:
                self._report(slot, e)
        finally:
            slot.compile_s = time.perf_counter() - t0
            slot.done.set()
        if slot.compiled is not None:
            log.info("torchfarm: graph %d of %s key=%s is ready after %.2fs; it switches at "
                     "the next call of the model", slot.index, self.name, slot.key[:12],
                     slot.compile_s)

    def _report(self, slot: GraphSlot, e: BaseException) -> None:
        FALLBACKS.labels(error=type(e).__name__).inc()
        outcomes.record(outcomes.EAGER)
        code = f" [{e.code}]" if isinstance(e, FarmError) and e.code else ""
        with self._lock:
            first, self._warned = not self._warned, True
        # A farm bug is not an outage: every one is warned of, with its key, to report it.
        loud = first or isinstance(e, FarmBug)
        log.log(
            logging.WARNING if loud else logging.INFO,
            "torchfarm: graph %d of %s keeps running eagerly (%s%s): %s",
            slot.index, self.name, type(e).__name__, code, e,
            exc_info=e if not isinstance(e, FarmError) else None,
        )

    def step_boundary(self) -> None:
        """Switches every ready graph to its compiled code; raises a background error
        that must reach the caller, once."""
        with self._lock:
            self.calls += 1
            ready = [s for s in self.graphs if s.state == READY]
            pending, self._to_raise = self._to_raise, []
        for slot in ready:
            slot.swap(self.calls)
        if ready:
            log.info("torchfarm: %s switched graph(s) %s to compiled code at call %d",
                     self.name, ", ".join(str(s.index) for s in ready), self.calls)
        if pending:
            raise pending[0]

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Waits until every compile started so far has ended (ready or failed); True
        if all did within `timeout`. The switch itself happens at the next call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                pending = [s for s in self.graphs if not s.done.is_set()]
            if not pending:
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            pending[0].done.wait(remaining)


_SWAPPERS: weakref.WeakKeyDictionary[Any, Swapper] = weakref.WeakKeyDictionary()


def attach(compiled: Any, swapper: Swapper) -> Any:
    """Makes the start of each call of `compiled` (what torch.compile returned) a step
    boundary; returns what `sdk.compile` hands to the user."""
    if isinstance(compiled, torch.nn.Module):
        compiled.register_forward_pre_hook(lambda module, args: swapper.step_boundary())
        result = compiled
    else:
        @functools.wraps(compiled)
        def result(*args: Any, **kwargs: Any) -> Any:
            swapper.step_boundary()
            return compiled(*args, **kwargs)

    _SWAPPERS[result] = swapper
    return result


def swapper_of(model: Any) -> Swapper:
    try:
        return _SWAPPERS[model]
    except (KeyError, TypeError):
        raise ConfigError("this model was not compiled with sdk.compile(..., wait=False)") from None


def wait_ready(model: Any, timeout: float | None = None) -> bool:
    """Waits until the farm compiles of `model`'s graphs started so far have ended;
    True if they all did within `timeout` seconds. A model compiled with
    `sdk.compile(..., wait=False)`; the graphs switch at its next call."""
    return swapper_of(model).wait_ready(timeout)
