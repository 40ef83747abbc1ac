"""sdk.export through a real stack: redis-server, the gRPC coordinator, a Celery worker.

Numerics: the loaded AOTInductor package against eager, inference, within 1e-5
absolute plus 1e-5 relative (float32; Inductor reorders reductions, so bit-equality is
not expected).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import sdk
from examples.models import make_cnn, make_mlp
from sdk import artifact
from sdk.backend import build_request
from sdk.client import FarmClient, parse_address
from sdk.errors import ArtifactRejected, GraphRejected, RequestTooLarge
from sdk.export_codec import encode_export
from sdk.settings import SDKSettings
from sdk.trust import Trust
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.settings import from_env
from torchfarm.wire.manifest import EXPORT, Manifest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

TOL = dict(atol=1e-5, rtol=1e-5)


def _eval(make):
    model, inputs = make()
    return model.eval(), inputs


def test_mlp_export_matches_eager_and_is_a_cache_hit_the_second_time(stack, tmp_path):
    model, (x,) = _eval(make_mlp)
    first = sdk.export(model, (x,), remote=stack.address, path=tmp_path / "mlp.pt2")
    assert not first.cache_hit and first.path.exists()
    runner = first.load()
    with torch.no_grad():
        torch.testing.assert_close(runner(x), model(x), **TOL)

    again = sdk.export(model, (x,), remote=stack.address, path=tmp_path / "again.pt2")
    assert again.cache_hit and again.key == first.key
    assert again.path.read_bytes() == first.path.read_bytes()
    manifest = Manifest.from_json(stack.store().get_manifest_bytes(first.key))
    assert manifest.kind == EXPORT and manifest.signature is not None


def test_cnn_export_with_a_dynamic_batch_matches_eager(stack, tmp_path):
    model, (x,) = _eval(make_cnn)
    batch = torch.export.Dim("batch", min=1, max=32)
    pkg = sdk.export(
        model, (x,), dynamic_shapes=({0: batch},), remote=stack.address, path=tmp_path / "cnn.pt2"
    )
    runner = pkg.load()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for b in (1, 4, 7):
            xb = torch.randn(b, 3, 16, 16, generator=gen)
            torch.testing.assert_close(runner(xb), model(xb), **TOL)


def test_a_tampered_package_is_refused_and_never_written(stack, tmp_path):
    model, (x,) = _eval(make_mlp)
    pkg = sdk.export(model, (x,), remote=stack.address, path=tmp_path / "ok.pt2")
    store = stack.store()
    good = store.get_manifest_bytes(pkg.key)
    manifest = Manifest.from_json(good)

    # The manifest edited in Redis (the fingerprint of another ISA): the SDK's own
    # signature check refuses it. (Through sdk.export the coordinator, which pins the
    # same keys, would already treat it as a miss and rebuild.)
    other = "avx2" if manifest.fingerprint["isa"] != "avx2" else "avx512"
    store.put_manifest(dataclasses.replace(manifest, fingerprint={**manifest.fingerprint, "isa": other}))
    settings = from_env(SDKSettings)
    client = FarmClient(stack.address, settings)
    try:
        manifest_bytes, blobs = client.fetch(pkg.key)
    finally:
        client.close()
    trust = Trust.from_settings(settings, parse_address(stack.address))
    assert trust.verifies_signatures
    with pytest.raises(ArtifactRejected) as info:
        artifact.verify(manifest_bytes, blobs, pkg.key, local_fingerprint(), trust, kind=EXPORT)
    assert info.value.code == "invalid"

    # The package's bytes changed in Redis: the coordinator's digest check refuses it.
    store.put_manifest(manifest)  # the original again
    digest = manifest.payload.digest
    store.r.set(f"tf:blob:{digest}", bytes(b ^ 0x5A for b in store.get_blob(digest)))
    with pytest.raises(ArtifactRejected) as info:
        sdk.export(model, (x,), remote=stack.address, path=tmp_path / "tampered.pt2")
    assert info.value.code == "corrupt"
    assert not (tmp_path / "tampered.pt2").exists()


def test_an_op_off_the_allow_list_is_invalid_argument_naming_it(stack):
    model, (x,) = _eval(make_mlp)
    graph, spec = encode_export(torch.export.export(model, (x,)))
    node = next(n for n in graph.nodes if n.target.startswith("torch.ops.aten.linear"))
    node.target = "torch.ops.aten.set_.source_Tensor"  # swaps storage: denied
    request = build_request(graph, local_fingerprint(), "", {}, "disallowed op")
    request.export.CopyFrom(spec)
    client = FarmClient(stack.address, SDKSettings(remote=stack.address))
    try:
        with pytest.raises(GraphRejected) as info:
            client.submit(request)
    finally:
        client.close()
    assert info.value.code == "DISALLOWED_OP"
    assert "torch.ops.aten.set_.source_Tensor" in str(info.value)


def test_a_model_over_the_request_limit_is_refused_with_its_size(stack, tmp_path):
    big = torch.nn.Linear(2048, 2048).eval()  # 16 MiB of weights: over the 16 MiB default
    with pytest.raises(RequestTooLarge) as info:
        sdk.export(big, (torch.randn(2, 2048),), remote=stack.address, path=tmp_path / "big.pt2")
    assert "bytes" in str(info.value) and "at most" in str(info.value)
    assert not (tmp_path / "big.pt2").exists()
