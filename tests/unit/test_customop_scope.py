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


def test_a_new_overload_of_an_op_torch_loaded_is_refused():
    """A stand-in may not add an overload to an op of torch's own: it would answer for it."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - loads quantized_decomposed, as Inductor does

    text = "quantized_decomposed::quantize_per_tensor.extra(Tensor x) -> Tensor"
    with pytest.raises(torch_library.RefusedCustomOp, match="exists on this worker"), torch_library.job_scope():
        torch_library.ensure_op(text)


def test_a_stand_in_may_have_two_overloads():
    with torch_library.job_scope():
        torch_library.ensure_op("tfscope::pair(Tensor x) -> Tensor")
        torch_library.ensure_op("tfscope::pair.scaled(Tensor x, float s) -> Tensor")
        assert set(torch.ops.tfscope.pair.overloads()) == {"default", "scaled"}
