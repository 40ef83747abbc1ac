"""Custom-op stand-ins live as long as one job (issue 40, item 4): tenant A's
declaration of `ns::fused_gelu(Tensor x, int pad)` must neither break tenant B's
`ns::fused_gelu(Tensor x)` in the same worker process nor show B that A used the name."""

from __future__ import annotations

import pytest
import torch

from torchfarm.customops import parse_schema
from torchfarm.fx import customops

A = "tfscope::fused_gelu(Tensor x, int pad) -> Tensor"
B = "tfscope::fused_gelu(Tensor x) -> Tensor"


def visible(text: str) -> bool:
    """Whether this process resolves the op `text` names (what a later job could probe)."""
    return customops.resolve(parse_schema(text)) is not None


def test_two_tenants_conflicting_declarations_both_resolve_in_sequence():
    with customops.job_scope():
        customops.ensure_op(A)
        assert str(customops.resolve(parse_schema(A))._schema) == A
    assert not visible(A)  # B learns nothing of A's names
    assert not hasattr(torch.ops.tfscope, "fused_gelu")
    with customops.job_scope():
        customops.ensure_op(B)
        assert str(customops.resolve(parse_schema(B))._schema) == B
    assert not visible(B)


def test_a_job_that_fails_leaves_no_stand_in():
    with pytest.raises(RuntimeError), customops.job_scope():
        customops.ensure_op(A)
        raise RuntimeError("the compile failed")
    assert not visible(A)
