"""A stand-in for a CUDA GPU, for tests on machines without one (tests/integration/test_gpu_fork.py).

Put this directory on PYTHONPATH and set TORCHFARM_TEST_FAKE_CUDA to a log file: every
Python process started then (a worker, its pool, the device probe, a sandbox child)
sees one CUDA device, "sm_90", through `torch.cuda`. It behaves as the real one does
where a worker's safety depends on it (torch/cuda/__init__.py, torch 2.13):

- the calls that start CUDA (`_lazy_init` and everything that reads device properties,
  `is_available` and `device_count` unless PYTORCH_NVML_BASED_CUDA_CHECK=1) record
  `init <pid> <call>` in the log;
- a process that started it and then forks records `fork-after-init <pid> <call>`;
- in such a fork, starting CUDA raises "Cannot re-initialize CUDA in forked subprocess".

The log is appended to with O_APPEND, one short line a write; a process that cannot
open it (a bubblewrap child sees a read-only root) still raises in a bad fork.
"""

from __future__ import annotations

import os
import sys

LOG = os.environ.get("TORCHFARM_TEST_FAKE_CUDA", "")


def _record(line: str) -> None:
    try:
        fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


class _State:
    started_by = ""  # the call that started CUDA in this process
    bad_fork = False


def _start(call: str) -> None:
    if _State.bad_fork:
        raise RuntimeError(
            "Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
            "multiprocessing, you must use the 'spawn' start method"
        )
    if not _State.started_by:
        _State.started_by = call
        _record(f"init {os.getpid()} {call}")


def _before_fork() -> None:
    if _State.started_by:
        _record(f"fork-after-init {os.getpid()} {_State.started_by}")


def _in_child() -> None:
    if _State.started_by:
        _State.bad_fork, _State.started_by = True, ""


class _Props:
    name = "Fake NVIDIA H100 (test stand-in)"
    major, minor = 9, 0
    multi_processor_count = 132
    total_memory = 80 * 2**30
    gcnArchName = ""  # noqa: N815  (torch's name)


def _patch(cuda) -> None:  # noqa: ANN001
    def nvml_or_start(call: str) -> None:
        if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1":
            _start(call)

    def is_available() -> bool:
        nvml_or_start("is_available")
        return True

    def device_count() -> int:
        nvml_or_start("device_count")
        return 1

    def starting(call: str, value):  # noqa: ANN001, ANN202
        def fake(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
            _start(call)
            return value
        return fake

    cuda.is_available = is_available
    cuda.device_count = device_count
    cuda.is_initialized = lambda: bool(_State.started_by)
    for call, value in (("_lazy_init", None), ("init", None), ("current_device", 0),
                        ("get_device_properties", _Props()), ("get_device_capability", (9, 0)),
                        ("get_device_name", _Props.name), ("set_device", None), ("synchronize", None)):
        setattr(cuda, call, starting(call, value))


class _Finder:
    """Patches torch.cuda as it is first imported, without importing torch here."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if name != "torch.cuda":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        real_exec = spec.loader.exec_module

        def exec_module(module) -> None:  # noqa: ANN001
            real_exec(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if LOG:
    sys.meta_path.insert(0, _Finder())
    os.register_at_fork(before=_before_fork, after_in_child=_in_child)
