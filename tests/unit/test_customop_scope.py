"""Custom-op stand-ins live as long as one job (issue 40, item 4): tenant A's
declaration of `ns::fused_gelu(Tensor x, int pad)` must neither break tenant B's
`ns::fused_gelu(Tensor x)` in the same worker process nor show B that A used the name."""

from __future__ import annotations

import pytest
import torch

from torchfarm.fx import torch_library
from torchfarm.graph.customops import parse_schema

A = "tfscope::fused_gelu(Tensor x, int pad) -> Tensor"
B = "tfscope::fused_gelu(Tensor x) -> Tensor"


def visible(text: str) -> bool:
    """Whether this process resolves the op `text` names (what a later job could probe)."""
    return torch_library.resolve(parse_schema(text)) is not None


def test_two_tenants_conflicting_declarations_both_resolve_in_sequence():
    with torch_library.job_scope():
        torch_library.ensure_op(A)
        assert str(torch_library.resolve(parse_schema(A))._schema) == A
    assert not visible(A)  # B learns nothing of A's names
    assert not hasattr(torch.ops.tfscope, "fused_gelu")
    with torch_library.job_scope():
        torch_library.ensure_op(B)
        assert str(torch_library.resolve(parse_schema(B))._schema) == B
    assert not visible(B)


def test_a_job_that_fails_leaves_no_stand_in():
    with pytest.raises(RuntimeError), torch_library.job_scope():
        torch_library.ensure_op(A)
        raise RuntimeError("the compile failed")
    assert not visible(A)
