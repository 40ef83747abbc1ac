"""Writes torchfarm/data/inductor_refused.json: every Inductor setting of the installed
torch that the farm neither carries (torchfarm/wire/options.py ALLOWED) nor leaves to the
client (torchfarm/wire/inductor_settings.py CLIENT_ONLY), each with why it is refused.

Existing entries are kept, so the list covers every supported build: run it under each
(the second build's venv too, `make test-second-build`). A new setting gets a reason by
its name's kind, to be reviewed. Run after a torch upgrade:
tests/unit/test_inductor_settings.py fails until then.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch._inductor.config as inductor_config

from torchfarm.wire import inductor_settings, options

OUT = Path(__file__).resolve().parent.parent / "torchfarm" / "data" / "inductor_refused.json"


def reason(name: str, default: object) -> str:
    leaf = name.rsplit(".", 1)[-1]
    if callable(default) or "custom_pass" in name or name in getattr(inductor_config, "_save_config_ignore", []):
        return "takes a callable or an object: code a worker would run for a stranger"
    if any(w in leaf for w in ("dir", "path", "cxx", "file", "include", "lib", "command", "ld_")):
        return "a path or a program on the host: means nothing, or something hostile, on a worker"
    if name.startswith(("trace.", "debug")) or any(
        w in leaf for w in ("debug", "log", "dump", "trace", "profil", "repro", "verbose", "print", "save")
    ):
        return "debugging or tracing output: written on the worker, where the user never sees it"
    if name.startswith(("aot_inductor.", "aot_inductor_mode.")):
        return "AOTInductor packaging: sdk.export's path, not a graph compile's"
    if name.startswith(("cuda.", "cutlass.", "xpu.", "rocm.", "halide.", "mtia.")):
        return "a backend the farm's workers are not checked against"
    return "not reviewed for remote compiles: it may change what the worker builds"


def main() -> None:
    old = json.loads(OUT.read_text()) if OUT.exists() else {}
    out: dict[str, str] = dict(old)  # settings of the other supported builds stay
    for name in sorted(inductor_config._config):
        if name in options.ALLOWED or name in inductor_settings.CLIENT_ONLY:
            continue
        out[name] = old.get(name) or reason(name, inductor_config._config[name].default)
    OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{len(out)} refused settings written to {OUT}")


if __name__ == "__main__":
    main()
