"""Which Celery queue serves which target.

One queue per device kind today ("cpu", "cuda", ...). A worker that takes a job still
checks the exact fingerprint (ISA, compiler, torch build) and refuses a mismatch, so a
coarse queue can never produce an artifact for the wrong target.
"""

from __future__ import annotations

from torchfarm.v1 import farm_pb2

DEVICES = ("cpu", "cuda", "rocm", "mps", "xpu")
"""Device kinds the farm knows. Anything else is rejected as INVALID_ARGUMENT."""

COMPILE_TASK = "torchfarm.compile"
"""The Celery task name the coordinator sends and workers register."""


class UnknownDevice(ValueError):
    pass


def queue_for(target: farm_pb2.Target) -> str:
    if target.device not in DEVICES:
        raise UnknownDevice(
            f"unknown device {target.device!r}; the farm knows {', '.join(DEVICES)}"
        )
    return target.device


def describe(target: farm_pb2.Target) -> str:
    """A short human name for a target, for error messages: "cpu:avx512", "cuda:sm_90"."""
    detail = target.arch or target.isa
    return f"{target.device}:{detail}" if detail else target.device
