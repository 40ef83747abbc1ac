"""Export's encoding, checks and key, and the torch 2.13 internals they rely on.

No farm here: sdk/export_codec.py against torch.export, torchfarm/graph/exportcheck.py against
hand-made messages, the export key's domain, and workers/aoti.py's module
rebuilt and exported again (without AOTInductor, which takes tens of seconds; the
integration test runs it).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch._inductor import config as inductor_config

from examples.models import MLP
from sdk import artifact
from sdk.backend import build_request
from sdk.errors import ArtifactRejected
from sdk.export_codec import encode_export, tensor_bytes
from sdk.trust import Trust
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.graph import exportcheck
from torchfarm.graph.graph_errors import MalformedGraph
from torchfarm.trust.signing import TrustedKeys
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys, routing, targets
from torchfarm.wire.manifest import COMPILE, EXPORT, BlobRef, Manifest, ManifestError, blob_digest

Weight = farm_pb2.ExportWeight


class WithBuffer(torch.nn.Module):
    """A parameter, a persistent and a non-persistent buffer, kwargs, a dict output."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))
        self.register_buffer("shift", torch.arange(3.0), persistent=False)

    def forward(self, x, *, bias):
        y = self.lin(x) * self.scale + self.shift + bias
        return {"y": y, "z": (y.sum(1),)}


@pytest.fixture(scope="module")
def mlp_export():
    torch.manual_seed(0)
    model = MLP(width=8, depth=1, classes=2).eval()
    x = torch.randn(4, 8)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("b", min=1, max=64)},))
    return model, ep, *encode_export(ep)


def _request(graph, spec, **build):
    fp = local_fingerprint()
    request = build_request(graph, fp, "", {}, "unit")
    if spec is not None:
        request.export.CopyFrom(spec)
    for k, v in build.items():
        setattr(request.build, k, v)
    return request


# -- torch internals this relies on (pinned) -------------------------------------


def test_torch_export_placeholders_follow_the_signature_and_state_dict():
    ep = torch.export.export(WithBuffer().eval(), (torch.randn(2, 4),), {"bias": torch.randn(3)})
    placeholders = [n.name for n in ep.graph.nodes if n.op == "placeholder"]
    specs = ep.graph_signature.input_specs
    assert [s.arg.name for s in specs] == placeholders
    kinds = {s.target: (s.kind.name, s.persistent) for s in specs if s.target}
    assert kinds == {
        "lin.weight": ("PARAMETER", None),
        "lin.bias": ("PARAMETER", None),
        "scale": ("BUFFER", True),
        "shift": ("BUFFER", False),
    }
    assert set(ep.state_dict) == {"lin.weight", "lin.bias", "scale"} and set(ep.constants) == {"shift"}


def test_treespec_json_is_protocol_1_of_plain_containers():
    ep = torch.export.export(WithBuffer().eval(), (torch.randn(2, 4),), {"bias": torch.randn(3)})
    text = torch.utils._pytree.treespec_dumps(ep.call_spec.in_spec)
    body = json.loads(text)
    assert body[0] == exportcheck.TREESPEC_PROTOCOL
    tree = exportcheck.parse_treespec(text)
    assert [c.kind for c in tree.children] == ["tuple", "dict"] and tree.children[1].keys == ("bias",)
    out = exportcheck.parse_treespec(torch.utils._pytree.treespec_dumps(ep.call_spec.out_spec))
    assert out.kind == "dict" and out.keys == ("y", "z") and out.leaves() == 2
    assert torch.utils._pytree.treespec_loads(text) == ep.call_spec.in_spec


# -- encoding ---------------------------------------------------------------------


def test_encoding_carries_every_weight_by_value(mlp_export):
    model, ep, graph, spec = mlp_export
    state = dict(model.state_dict())
    assert [w.fqn for w in spec.weights] == list(state)
    for w in spec.weights:
        assert w.kind == Weight.PARAMETER and w.dtype == "float32"
        assert list(w.shape) == list(state[w.fqn].shape)
        assert w.data == tensor_bytes(state[w.fqn])
        restored = torch.frombuffer(bytearray(w.data), dtype=torch.float32).reshape(tuple(w.shape))
        assert torch.equal(restored, state[w.fqn])
    assert [(d.symbol, d.min, d.max) for d in spec.dims] == [(graph.symbols[0].name, 1, 64)]
    targets_ = {n.target for n in graph.nodes if n.op == n.CALL_FUNCTION}
    assert "torch.ops.aten.linear.default" in targets_


def test_encoding_of_buffers_constants_and_kwargs():
    model = WithBuffer().eval()
    ep = torch.export.export(model, (torch.randn(2, 4),), {"bias": torch.randn(3)})
    graph, spec = encode_export(ep)
    kinds = {w.fqn: (w.kind, w.persistent) for w in spec.weights}
    assert kinds["scale"] == (Weight.BUFFER, True) and kinds["shift"] == (Weight.BUFFER, False)
    exportcheck.validate_export(graph, spec)


class Scaled(torch.nn.Module):
    def forward(self, x, n: int):
        return x * n


def test_a_non_tensor_input_is_refused_with_the_reason():
    from torchfarm.fx.encode import UnsupportedGraph

    ep = torch.export.export(Scaled(), (torch.randn(3), 2))
    with pytest.raises(UnsupportedGraph, match="inputs are all tensors"):
        encode_export(ep)


# -- checks -------------------------------------------------------------------------


def _copy(spec):
    out = farm_pb2.ExportSpec()
    out.CopyFrom(spec)
    return out


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda s: s.weights[0].__setattr__("data", s.weights[0].data[:-4]), "bytes"),
        (lambda s: s.weights[0].__setattr__("placeholder", "nope"), "names no placeholder"),
        (lambda s: s.weights[1].__setattr__("fqn", s.weights[0].fqn), "distinct"),
        (lambda s: s.weights[0].__setattr__("fqn", "a..b"), "distinct dotted"),
        (lambda s: s.weights[0].__setattr__("dtype", "float64"), "dtype"),
        (lambda s: s.weights[0].shape.append(1), "shape"),
        (lambda s: s.__setattr__("in_spec", s.in_spec.replace("builtins.dict", "collections.OrderedDict")), "type"),
        (lambda s: s.__setattr__("out_spec", '[1, {"type": "torch.fx.Graph", "context": "null", "children_spec": []}]'), "type"),
        (lambda s: s.__setattr__("out_spec", "not json"), "JSON"),
        (lambda s: s.dims.add(symbol="s999", min=1), "undeclared"),
        (lambda s: s.dims[0].__setattr__("max", 0) or s.dims[0].__setattr__("min", -1), "range"),
        (lambda s: s.weights.pop(), "tensors, the graph"),
    ],
)
def test_validate_export_refuses(mlp_export, edit, match):
    _, _, graph, spec = mlp_export
    bad = _copy(spec)
    edit(bad)
    with pytest.raises(MalformedGraph, match=match):
        exportcheck.validate_export(graph, bad)


def test_deep_or_huge_pytree_specs_are_refused():
    node: dict = {"type": None, "context": None, "children_spec": []}
    for _ in range(exportcheck.MAX_TREE_DEPTH + 1):
        node = {"type": "builtins.tuple", "context": "null", "children_spec": [node]}
    with pytest.raises(Exception, match="deep"):
        exportcheck.parse_treespec(json.dumps([1, node]))


def test_a_dict_context_nested_past_the_parsers_depth_is_malformed():
    context = "[" * 100_000 + "]" * 100_000
    spec = json.dumps([1, {"type": "builtins.dict", "context": context, "children_spec": []}])
    with pytest.raises(MalformedGraph, match="dict"):
        exportcheck.parse_treespec(spec)


# -- the key ------------------------------------------------------------------------


def test_export_key_is_its_own_domain(mlp_export):
    _, _, graph, spec = mlp_export
    compile_key = keys.compute_key(_request(graph, None))
    export_key = keys.compute_key(_request(graph, spec))
    assert compile_key != export_key
    assert keys.compute_key(_request(graph, spec)) == export_key  # deterministic
    labelled = _request(graph, spec)
    labelled.label = "another label"
    assert keys.compute_key(labelled) == export_key


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.weights[0].__setattr__("data", bytes(len(s.weights[0].data))),
        lambda s: s.weights[0].__setattr__("fqn", "other.weight"),
        lambda s: s.dims[0].__setattr__("max", 32),
        lambda s: s.__setattr__("out_spec", s.out_spec + " "),
    ],
    ids=["weight bytes", "weight path", "dynamic range", "output spec"],
)
def test_export_key_covers_weights_dims_and_specs(mlp_export, edit):
    _, _, graph, spec = mlp_export
    changed = _copy(spec)
    edit(changed)
    assert keys.compute_key(_request(graph, changed)) != keys.compute_key(_request(graph, spec))


def test_export_key_covers_build_and_target(mlp_export):
    _, _, graph, spec = mlp_export
    base = keys.compute_key(_request(graph, spec))
    assert keys.compute_key(_request(graph, spec, torch_version="2.99.0")) != base
    other = _request(graph, spec)
    other.target.isa = "avx2" if other.target.isa != "avx2" else "avx512"
    assert keys.compute_key(other) != base


def test_export_shares_the_targets_graph_queue():
    target = targets.make("cpu", "avx512")
    assert routing.queue_name(target, routing.EXPORT) == routing.queue_name(target, routing.GRAPH)


# -- manifest kind --------------------------------------------------------------------


def _manifest(kind: str) -> tuple[Manifest, dict[str, bytes]]:
    data = b"package"
    fp = local_fingerprint().to_dict()
    return Manifest(key="k" * 64, fingerprint=fp, payload=BlobRef(blob_digest(data), len(data)), kind=kind), {
        blob_digest(data): data
    }


def test_manifest_kind_round_trips_and_compile_manifests_are_unchanged():
    compile_manifest, _ = _manifest(COMPILE)
    assert "kind" not in json.loads(compile_manifest.to_json())
    export_manifest, _ = _manifest(EXPORT)
    assert Manifest.from_json(export_manifest.to_json()).kind == EXPORT
    with pytest.raises(ManifestError):
        Manifest.from_json(export_manifest.to_json().replace(b'"export"', b'"exec"'))


def test_the_sdk_refuses_an_artifact_of_the_other_kind():
    manifest, blobs = _manifest(EXPORT)
    fp = local_fingerprint()
    dev_farm = Trust(keys=TrustedKeys({}), namespace="", unsigned=True)
    assert artifact.verify(manifest.to_json(), blobs, manifest.key, fp, dev_farm, kind=EXPORT) == manifest
    with pytest.raises(ArtifactRejected, match="kind"):
        artifact.verify(manifest.to_json(), blobs, manifest.key, fp, dev_farm)


# -- the worker's rebuilt module ----------------------------------------------------


def test_rebuilt_module_exports_again_with_the_clients_calling_convention():
    from torchfarm.fx.decode import decode_graph
    from workers.aoti import ExportedModule, weight_tensor

    model = WithBuffer().eval()
    x, bias = torch.randn(2, 4), torch.randn(3)
    ep = torch.export.export(model, (x,), {"bias": bias})
    graph, spec = encode_export(ep)
    weights = {w.placeholder: (w, weight_tensor(w, torch.device("cpu"))) for w in spec.weights}
    placeholders = [n.name for n in graph.nodes if n.op == n.PLACEHOLDER]
    out_spec = torch.utils._pytree.treespec_loads(spec.out_spec)
    rebuilt = ExportedModule(decode_graph(graph).gm, placeholders, weights, out_spec).eval()
    assert dict(rebuilt.state_dict()).keys() == dict(model.state_dict()).keys()
    again = torch.export.export(rebuilt, (x,), {"bias": bias})
    assert again.call_spec.in_spec == ep.call_spec.in_spec
    assert again.call_spec.out_spec == ep.call_spec.out_spec
    got, want = again.module()(x, bias=bias), model(x, bias=bias)
    torch.testing.assert_close(got["y"], want["y"])
    torch.testing.assert_close(got["z"][0], want["z"][0])


def test_an_input_dimension_must_be_static_or_a_declared_dynamic_dim(mlp_export):
    _, _, graph, spec = mlp_export
    without_dims = _copy(spec)
    del without_dims.dims[:]
    with pytest.raises(MalformedGraph, match="dimension 0"):
        exportcheck.validate_export(graph, without_dims)
    derived = farm_pb2.CompileRequest(graph=graph).graph
    x = next(n for n in derived.nodes if n.op == n.PLACEHOLDER and n.name not in {w.placeholder for w in spec.weights})
    x.tensor.shape[0].expr = f"2*{x.tensor.shape[0].expr}"
    with pytest.raises(MalformedGraph, match="derived"):
        exportcheck.validate_export(derived, spec)


# -- another target -------------------------------------------------------------------


class _FleetStatus:
    """Stands in for FarmClient: only `status()`, which sdk.fleet reads."""

    def __init__(self, target: str, fingerprint: dict[str, str]):
        self.reply = farm_pb2.FarmStatus(
            workers=[
                farm_pb2.WorkerInfo(
                    name="w1",
                    targets=[farm_pb2.ServedTarget(target=target, jobs=["graph"])],
                    fingerprint=fingerprint,
                )
            ]
        )

    def status(self):
        return self.reply


def _other_cpu_target():
    here = local_fingerprint().isa
    return targets.make("cpu", "avx2" if here != "avx2" else "avx512")


def test_another_target_is_verified_against_its_fleets_fingerprint():
    from sdk.exports import _target_build
    from torchfarm.fx.fingerprint import build_fields

    other = _other_cpu_target()
    fleet = {**build_fields(local_fingerprint()), "isa": other.isa, "compiler": "fleet-gcc"}
    wanted, fp = _target_build(_FleetStatus(str(other), fleet), str(other), [torch.zeros(1)])
    assert wanted == other
    assert fp.isa == fleet["isa"] and fp.compiler == "fleet-gcc" and fp != local_fingerprint()
    here, mine = _target_build(_FleetStatus(str(other), fleet), None, [torch.zeros(1)])
    assert mine == local_fingerprint() and here != other


def test_a_package_for_another_target_does_not_load_here(tmp_path):
    from sdk.errors import ConfigError
    from sdk.exports import ExportedPackage

    pkg = ExportedPackage(path=tmp_path / "m.pt2", key="k" * 64, target=_other_cpu_target(), cache_hit=False)
    with pytest.raises(ConfigError, match="built for"):
        pkg.load()


def test_sequential_attribute_paths_start_with_a_digit():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2)).eval()
    graph, spec = encode_export(torch.export.export(model, (torch.randn(1, 3),)))
    assert [w.fqn for w in spec.weights] == ["0.weight", "0.bias"]
    exportcheck.validate_export(graph, spec)


@pytest.mark.timeout(300)  # a real AOTInductor build
def test_building_a_package_leaves_the_workers_inductor_config_as_it_was(mlp_export):
    # aoti_compile_and_package fills aot_inductor.metadata in place and leaves it so: a
    # worker's later compiles ran with the export's metadata in their config.
    from workers.aoti import build_package

    _, _, graph, spec = mlp_export
    before = copy.deepcopy(inductor_config.get_config_copy())
    assert build_package(graph, spec).package
    assert inductor_config.get_config_copy() == before
