"""The deployment test's client (scripts/test_deploy.sh runs it in the client image).

    python client_check.py --expect compiled|hit [train_gpt.py's arguments...]

Trains examples/train_gpt.py through the farm (fallback="error": the farm answers every
graph or the run fails, so nothing compiles locally), with the token, CA and pinned key
the client image's TORCHFARM_* variables name. Then checks what the farm did for each
graph (sdk/report.py) and that no warning about trust, signatures or plaintext was
logged, and prints one line `CLIENT-RESULT {json}`. Exit status 0 only if all holds.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import warnings

sys.path.insert(0, ".")

from examples import train_gpt  # noqa: E402
from sdk import report  # noqa: E402

TRUST_WORDS = re.compile(r"trust|unsigned|signature|pinned|plaintext|loopback|refus", re.I)
"""What a warning about the farm's trust or the channel's security says."""

EXPECT = {
    "compiled": lambda outcomes: report.LOCAL not in outcomes and report.COMPILED in outcomes
    and set(outcomes) <= {report.COMPILED, report.JOINED, report.HIT},
    "hit": lambda outcomes: bool(outcomes) and set(outcomes) == {report.HIT},
}


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}")


def main(argv: list[str]) -> int:
    expect = argv[argv.index("--expect") + 1]
    rest = [a for i, a in enumerate(argv) if a != "--expect" and (i == 0 or argv[i - 1] != "--expect")]
    logs = _Collect()
    logging.getLogger().addHandler(logs)
    with warnings.catch_warnings(record=True) as caught, report.collect() as graphs:
        warnings.simplefilter("always")
        sys.argv = ["train_gpt.py", "--fallback", "error", *rest]
        train_gpt.main()
    outcomes = [g.outcome for g in graphs]
    messages = logs.messages + [str(w.message) for w in caught]
    trust_warnings = [m for m in messages if TRUST_WORDS.search(m)]
    ok = EXPECT[expect](outcomes) and not trust_warnings
    print("CLIENT-RESULT " + json.dumps({
        "ok": ok, "expect": expect, "outcomes": outcomes, "trust_warnings": trust_warnings,
        "warnings": messages[-10:],
    }), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
