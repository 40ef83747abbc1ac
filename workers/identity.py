"""The build a worker registers, routes on and checks jobs against.

It is this machine's fingerprint for the worker's graph target (torchfarm/fx/fingerprint.py),
unless TORCHFARM_REPORTED_BUILD overrides some of its build fields. That is a test hook:
one machine with one torch can then play two workers of different builds, so the tests
can show that a client of one build never reaches a worker of another
(tests/integration/test_build_routing.py). A worker that reports a build it is not
compiles with its real one, so production never sets it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from typing import Any

from torchfarm.fx.fingerprint import Fingerprint, build_fields, fingerprint_for
from torchfarm.wire import builds
from torchfarm.wire.targets import Target

log = logging.getLogger(__name__)


class ReportedBuildError(ValueError):
    """TORCHFARM_REPORTED_BUILD is not a JSON object of build fields."""


def parse_override(text: str) -> dict[str, str]:
    """TORCHFARM_REPORTED_BUILD's fields: '{"torch_git": "..."}'; {} when empty."""
    if not text:
        return {}
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportedBuildError(f"TORCHFARM_REPORTED_BUILD is not JSON: {e}") from e
    if not isinstance(fields, dict):
        raise ReportedBuildError("TORCHFARM_REPORTED_BUILD must be a JSON object")
    unknown = set(fields) - set(builds.FIELDS)
    if unknown:
        raise ReportedBuildError(
            f"TORCHFARM_REPORTED_BUILD: unknown fields {sorted(unknown)}; "
            f"a build has {', '.join(builds.FIELDS)}"
        )
    return {k: str(v) for k, v in fields.items()}


def worker_fingerprint(target: Target, override: str = "") -> Fingerprint:
    """The fingerprint this worker stamps and checks for `target`, override applied."""
    fp = fingerprint_for(target)
    fields = parse_override(override)
    if fields:
        log.warning("this worker reports build fields it does not have (test hook): %s", fields)
        fp = dataclasses.replace(fp, **fields)
    return fp


def build_digest(fp: Fingerprint) -> str:
    """The digest that ends this worker's graph and stage queue names."""
    return builds.digest(fp.to_dict())


def registration(graph: Sequence[Target], kernel: Sequence[Target], override: str = "") -> dict[str, Any]:
    """What a worker's heartbeat registers of its build: `fingerprint`, the build of its
    graph target (else of its first kernel target), and `triton`, the Triton version its
    kernel jobs compile with when it takes any (a CPU target's build names none,
    torchfarm/wire/builds.py)."""
    fp = worker_fingerprint(graph[0], override) if graph else fingerprint_for(kernel[0])
    return {
        "fingerprint": build_fields(fp),
        "triton": fingerprint_for(kernel[0]).triton_version if kernel else None,
    }
