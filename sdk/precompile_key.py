"""The key of a precompiled package, computed without tracing (docs/sdk.md).

It covers what decides the frames Dynamo would build for this call: the code of the
module classes (their source, and the bytecode of `forward` with every code object
it holds), the module tree (names, classes, training flags), every parameter's and
buffer's metadata, the call's inputs (tree structure, tensor metadata, scalar
values), grad mode, the build fingerprint, the mode and Inductor options, and the
tenant's namespace. The key only finds a package: the package's own guards, checked
by Dynamo on the call, decide whether its frames run.

`record` puts the same components in the form the farm compares to explain a miss
(torchfarm/storage/explain.py): readable values where short, digests otherwise, and a part per
class, module, parameter and input, never the model's code or data.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import types
from collections.abc import Mapping
from typing import Any

import torch

from torchfarm.fx import global_state
from torchfarm.fx.internals import resolve
from torchfarm.storage.explain import MAX_PARTS, MAX_TEXT, digest
from torchfarm.v1 import farm_pb2
from torchfarm.wire.manifest import PRECOMPILED_PREFIX

pytree = resolve("pytree")


class Ineligible(Exception):
    """The model cannot be keyed without tracing; the reason is the message."""


def code_digest(code: types.CodeType) -> str:
    """SHA-256 over a code object's bytecode, names and constants, nested code included."""
    h = hashlib.sha256()
    _feed_code(h, code)
    return h.hexdigest()


def _feed_code(h: Any, code: types.CodeType) -> None:
    h.update(code.co_code)
    h.update(repr((code.co_name, code.co_qualname, code.co_names, code.co_varnames,
                   code.co_freevars, code.co_cellvars, code.co_argcount,
                   code.co_kwonlyargcount, code.co_flags)).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _feed_code(h, c)
        else:
            h.update(repr(c).encode())


def _class_digest(cls: type) -> str:
    # A class's source covers its methods; where there is none (built in a REPL), the
    # bytecode of every function it defines stands in.
    try:
        return hashlib.sha256(inspect.getsource(cls).encode()).hexdigest()
    except (OSError, TypeError):
        h = hashlib.sha256()
        for name, value in sorted(vars(cls).items()):
            if isinstance(value, types.FunctionType):
                h.update(name.encode())
                _feed_code(h, value.__code__)
        return h.hexdigest()


def _tensor_meta(t: torch.Tensor) -> list[Any]:
    return [list(t.shape), list(t.stride()), str(t.dtype), str(t.device), t.requires_grad,
            type(t).__name__]


def _leaf(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return ["tensor", *_tensor_meta(x)]
    if x is None or isinstance(x, (bool, int, float, str)):
        return [type(x).__name__, x]
    raise Ineligible(f"an input of type {type(x).__qualname__} has no key without tracing")


def components(model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """What the key covers of the model and the call, by component (for messages)."""
    forward = getattr(type(model), "forward", None)
    if not isinstance(forward, types.FunctionType):
        raise Ineligible(f"{type(model).__qualname__}.forward is not a Python function")
    classes: dict[str, str] = {}
    structure = []
    for name, m in model.named_modules():
        cls = type(m)
        qual = f"{cls.__module__}.{cls.__qualname__}"
        if qual not in classes:  # once per class: reading its source parses its file
            classes[qual] = _class_digest(cls)
        structure.append([name, qual, m.training])
    state = [[n, *_tensor_meta(t)] for n, t in model.named_parameters()]
    state += [[n, *_tensor_meta(t)] for n, t in model.named_buffers()]
    leaves, spec = pytree.tree_flatten((args, dict(kwargs)))
    inputs = {"tree": str(spec), "leaves": [_leaf(x) for x in leaves],
              "grad": torch.is_grad_enabled(), "autocast": global_state.autocast_now()}
    if sdpa := global_state.sdpa_backends_now():  # only when set: the default's keys stay
        inputs["sdpa_backends"] = sdpa
    if torch.are_deterministic_algorithms_enabled():
        inputs["deterministic"] = "warn_only" if torch.is_deterministic_algorithms_warn_only_enabled() else True
    return {
        "code": {"forward": code_digest(forward.__code__), "classes": classes},
        "structure": structure,
        "state": state,
        "inputs": inputs,
    }


def precompiled_key(parts: Mapping[str, Any], build: Mapping[str, str], options: Mapping[str, Any],
                    namespace: str) -> str:
    """The package's key: `PRECOMPILED_PREFIX` and a SHA-256 over every component."""
    body = {"model": parts, "build": dict(build), "options": dict(options), "namespace": namespace}
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    except TypeError as e:
        raise Ineligible(f"the compile options are not JSON values: {e}") from e
    return PRECOMPILED_PREFIX + hashlib.sha256(text.encode()).hexdigest()


def _text(value: Any) -> str:
    """`value` as the record carries it: itself where short, else its digest."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= MAX_TEXT else digest(value)


def record(model: torch.nn.Module, parts: Mapping[str, Any], build: Mapping[str, str],
           options: Mapping[str, Any]) -> farm_pb2.PrecompiledRecord:
    """The key's components by name, for the farm to explain a miss of this model."""
    b = build
    components = {
        "torch_build": f"torch {b['torch_version']} ({b['torch_git'][:12]}), Python {b['python']}, {b['platform']}",
        "triton": b["triton_version"] or "(none)",
        "cpu_isa": b["isa"],
        "gpu_arch": f"{b['device']}:{b['arch']}" if b["device"] != "cpu" else "",
        "compiler": b["compiler"],
        "options": _text(options),
        "model_code": digest(parts["code"]),
        "module_tree": digest(parts["structure"]),
        "parameters": digest(parts["state"]),
        "input_metadata": digest(parts["inputs"]),
    }
    components = {name: _text(value) for name, value in components.items()}
    inputs = parts["inputs"]
    cls = type(model)
    code = parts["code"]
    items: list[tuple[str, str, Any]] = [("model_code", f"{cls.__qualname__}.forward", code["forward"][:16])]
    items += [("model_code", qual, digest[:16]) for qual, digest in code["classes"].items()]
    items += [("module_tree", name or "(root)", f"{qual} training={training}")
              for name, qual, training in parts["structure"]]
    items += [("parameters", name, meta) for name, *meta in parts["state"]]
    items += [("input_metadata", "tree", inputs["tree"]), ("input_metadata", "grad mode", inputs["grad"]),
              ("input_metadata", "autocast", inputs["autocast"])]
    items += [("input_metadata", f"input {i}", leaf) for i, leaf in enumerate(inputs["leaves"])]
    return farm_pb2.PrecompiledRecord(
        model=f"{cls.__module__}.{cls.__qualname__}"[:MAX_TEXT],
        components=components,
        parts=[farm_pb2.PrecompiledPart(component=c, name=name[:MAX_TEXT], value=_text(value))
               for c, name, value in items[:MAX_PARTS]],
    )
