"""The farm's allow-list of graph targets, loaded once from package data.

`torchfarm/data/allowlist.json` is generated from the pinned torch by
`scripts/gen_allowlist.py` and committed; a unit test fails if regenerating changes it.
It holds two sorted lists:

- `functions`: canonical qualified names of call_function targets, as `torchfarm.fx.encode`
  writes them ("torch._C._nn.linear", "_operator.getitem", "torch.ops.aten.add.Tensor");
- `methods`: Tensor method names allowed as call_method targets ("view", "__getitem__");
- `attributes`: Tensor attribute names `builtins.getattr` may read ("T", "shape").

This module imports no torch: the coordinator checks graphs with it.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from importlib import resources

from torchfarm.graph import denylist

log = logging.getLogger(__name__)

ALLOWLIST_RESOURCE = "data/allowlist.json"
"""Path of the allow-list inside the `torchfarm` package."""


@dataclass(frozen=True)
class AllowList:
    torch_version: str
    """The torch build the list was generated from."""
    functions: frozenset[str]
    methods: frozenset[str]
    attributes: frozenset[str] = frozenset()


@functools.cache
def load_allowlist() -> AllowList:
    """Reads the committed allow-list once per process."""
    text = resources.files("torchfarm").joinpath(ALLOWLIST_RESOURCE).read_text("utf-8")
    raw = json.loads(text)
    allow = AllowList(
        torch_version=str(raw["torch_version"]),
        functions=frozenset(raw["functions"]),
        methods=frozenset(raw["methods"]),
        attributes=frozenset(raw.get("attributes", ())),
    )
    log.debug(
        "allow-list for torch %s: %d functions, %d methods",
        allow.torch_version,
        len(allow.functions),
        len(allow.methods),
    )
    return allow


def is_allowed_function(qualname: str) -> bool:
    """True if `qualname` may be the target of a call_function node."""
    return qualname in load_allowlist().functions


def is_allowed_method(name: str) -> bool:
    """True if the Tensor method `name` may be the target of a call_method node."""
    return name in load_allowlist().methods


def is_allowed_attribute(name: str) -> bool:
    """True if a graph may read the Tensor attribute `name` with `builtins.getattr`."""
    return name in load_allowlist().attributes


def refusal(name: str, kind: str = "op") -> str:
    """Why a graph calling `name` is refused: off the allow-list, and the deny-list's
    reason where a rule names it (`torchfarm.graph.denylist`)."""
    why = denylist.denial(name)
    return f"{kind} {name!r} is not on the farm's allow-list" + (f" ({why})" if why else "")
