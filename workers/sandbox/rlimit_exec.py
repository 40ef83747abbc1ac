"""Sets resource limits on this process, then becomes the command (exec): how a sandboxed
child gets its limits before it starts.

`preexec_fn` would set them in the forked child before exec, but it runs Python there,
in a copy of a worker with threads, which the Python documentation calls unsafe: it
crashed once, in threading's after-fork hook. This runs in a fresh interpreter instead,
started by path with `python -I -S`, so it imports nothing but the standard library.

    python -I -S rlimit_exec.py '[[resource, soft, hard], ...]' -- command args...
"""

import json
import os
import resource
import sys


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: rlimit_exec.py LIMITS_JSON -- COMMAND [ARG...]")
    for kind, soft, hard in json.loads(argv[1]):
        resource.setrlimit(kind, (soft, hard))
    command = argv[3:]
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"rlimit_exec: cannot run {command[0]}: {e}", file=sys.stderr)
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv)
