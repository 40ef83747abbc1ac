"""The end-to-end demo behind `make demo`.

Starts the embedded local stack (redis-server, coordinator, one CPU worker), then
trains the GPT example in fresh processes, each with an empty Inductor cache dir
unless noted:

1. local cold: plain torch.compile;
2. farm cold: through the farm, whose cache is empty;
3. farm hit: through the farm again, a new process with an empty cache dir, as a
   second machine would; it compiles nothing locally;
4. local warm: plain torch.compile reusing case 1's cache dir.

It prints each first-step time (compile call to end of the first backward) and the
ratios, and checks the farm's loss and gradients against eager PyTorch.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.harness import run_case, table  # noqa: E402
from localfarm.stack import LocalStack  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="torchfarm-demo-") as tmp:
        tmp = Path(tmp)
        with LocalStack(workers=1, workdir=tmp / "stack") as stack:
            print(f"local stack up at {stack.address}", flush=True)
            # The farm processes pin the stack's signing key: every load verifies a signature.
            os.environ["TORCHFARM_TRUSTED_KEYS_FILE"] = stack.client_env()["TORCHFARM_TRUSTED_KEYS_FILE"]
            print("1/4 local cold ...", flush=True)
            local_cold = run_case(args.model, "local", tmp / "local")
            print("2/4 farm cold ...", flush=True)
            farm_cold = run_case(args.model, "farm", tmp / "c1", remote=stack.address, check=True)
            print("3/4 farm hit (fresh process, empty cache dir) ...", flush=True)
            farm_hit = run_case(args.model, "farm", tmp / "c2", remote=stack.address, check=True)
            print("4/4 local warm ...", flush=True)
            local_warm = run_case(args.model, "local", tmp / "local")
        for line in farm_cold["log"] + farm_hit["log"]:
            print(line)
        print()
        print(table([
            ("local cold", local_cold["first_step_s"], "torch.compile, empty cache"),
            ("farm cold", farm_cold["first_step_s"],
             f"{farm_cold['first_step_s'] / local_cold['first_step_s']:.2f}x local cold"),
            ("farm hit", farm_hit["first_step_s"],
             f"{farm_hit['first_step_s'] / local_warm['first_step_s']:.2f}x local warm, "
             f"{local_cold['first_step_s'] / farm_hit['first_step_s']:.1f}x faster than local cold"),
            ("local warm", local_warm["first_step_s"], "torch.compile, warm cache"),
        ]))
        worst = max(farm_cold["grad_max_abs_err"], farm_hit["grad_max_abs_err"])
        print(
            f"\nfarm vs eager: loss error {max(farm_cold['loss_abs_err'], farm_hit['loss_abs_err']):.2e}, "
            f"max gradient error {worst:.2e}"
        )
        if worst > 1e-4:
            sys.exit("farm gradients differ from eager beyond 1e-4")


if __name__ == "__main__":
    main()
