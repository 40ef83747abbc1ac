"""The compile sandbox: every compile step on a tenant's input runs in a child process
that holds no secrets, and the worker's process only checks what comes back.

- process.py: the child and its limits, bubblewrap, the forkserver (`Sandbox`, `for_worker`);
- protocol.py: the files a run exchanges, read back checked (`Failure`, `SandboxFailed`);
- executor.py: the compile steps as child runs, their answers checked (`SandboxExecutor`);
- child.py: the child's side (`python -m workers.sandbox.child`).
"""

from workers.sandbox.executor import (
    SandboxExecutor,
    SpecStream,
    build_kernels,
    check_ranks,
    compile_triton,
    compile_whole,
    decompose,
    export_package,
    job_failure,
    lower_graph,
)
from workers.sandbox.process import (
    DEFAULT_HIDDEN,
    HEADERS,
    MODES,
    Forkserver,
    Limits,
    Sandbox,
    SandboxUnavailable,
    apply_limits,
    bwrap_argv,
    bwrap_works,
    child_command,
    child_env,
    for_worker,
    hidden_paths,
    limits_for,
    python_to_bind_back,
    resolve,
    scratch_env,
)
from workers.sandbox.protocol import RESULT_FILE, STREAM, Failure, SandboxFailed

__all__ = [
    "DEFAULT_HIDDEN", "HEADERS", "MODES", "RESULT_FILE", "STREAM", "Failure", "Forkserver", "Limits", "Sandbox",
    "SandboxExecutor", "SandboxFailed", "SandboxUnavailable", "SpecStream", "apply_limits", "build_kernels",
    "bwrap_argv", "bwrap_works", "check_ranks", "child_command", "child_env", "compile_triton", "compile_whole",
    "decompose", "export_package", "for_worker", "hidden_paths", "job_failure", "limits_for", "lower_graph",
    "python_to_bind_back", "resolve", "scratch_env",
]
