"""The precompiled package's key (sdk/precompile_key.py), manifest kind, and the
coordinator's checks of an upload (services/coordinator/precompiled.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sdk.precompile_key import Ineligible, components, precompiled_key
from services.coordinator.errors import InvalidRequest, RequestTooLarge
from services.coordinator.precompiled import check_upload
from torchfarm.v1 import farm_pb2
from torchfarm.wire.manifest import COMPILE, PRECOMPILED, BlobRef, Manifest, blob_digest


class Net(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.lin = nn.Linear(4, width)

    def forward(self, x):
        return self.lin(x).relu()


class Other(Net):
    def forward(self, x):
        return self.lin(x).sigmoid()


def _key(model, *args, namespace="", **kwargs):
    return precompiled_key(components(model, args, kwargs), {"torch": torch.__version__}, {"mode": ""}, namespace)


def test_the_key_is_stable_and_covers_code_structure_state_inputs_and_namespace():
    x = torch.randn(2, 4)
    base = _key(Net(), x)
    assert base.startswith("pc1-") and base == _key(Net(), x)
    trained = Net()
    trained.eval()
    frozen = Net()
    frozen.lin.bias.requires_grad_(False)
    changed = {
        "parameter shape": _key(Net(16), x),
        "forward's code": _key(Other(), x),
        "training flag": _key(trained, x),
        "requires_grad": _key(frozen, x),
        "input shape": _key(Net(), torch.randn(3, 4)),
        "input dtype": _key(Net(), x.double()),
        "namespace": _key(Net(), x, namespace="team-a"),
    }
    with torch.no_grad():
        changed["grad mode"] = _key(Net(), x)
    assert {k: v for k, v in changed.items() if v == base} == {}


def test_an_input_with_no_key_is_ineligible():
    with pytest.raises(Ineligible, match="object"):
        _key(Net(), object())


def _package(key="pc1-" + "a" * 64, tenant="", kind=PRECOMPILED, payload=b"pickled entry"):
    manifest = Manifest(key=key, fingerprint={"torch": "x"}, payload=BlobRef(blob_digest(payload), len(payload)),
                        tenant=tenant, kind=kind, graphs={"__compiled_fn_1": "f" * 64})
    return manifest, payload


def _upload(manifest, payload):
    return farm_pb2.PrecompiledUpload(
        manifest=manifest.to_json(), blobs=[farm_pb2.PrecompiledBlob(digest=manifest.payload.digest, data=payload)]
    )


def test_a_precompiled_manifest_round_trips_and_other_kinds_read_as_before():
    manifest, _ = _package()
    assert Manifest.from_json(manifest.to_json()) == manifest
    plain = Manifest(key="k", fingerprint={}, payload=BlobRef("sha256:0", 0), kind=COMPILE)
    assert b"graphs" not in plain.to_json()


def test_a_well_formed_upload_is_accepted_unread():
    manifest, payload = _package(tenant="team-a")
    got, blobs, _ = check_upload(_upload(manifest, payload), "team-a", 1 << 20)
    assert got == manifest and blobs == {manifest.payload.digest: payload}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"key": "f" * 64}, "not a precompiled key"),
        ({"kind": COMPILE}, "kind"),
        ({"tenant": "team-b"}, "another namespace"),
    ],
)
def test_an_upload_that_could_take_another_artifacts_place_is_refused(change, message):
    manifest, payload = _package(**{"tenant": "team-a", **change})
    with pytest.raises(InvalidRequest, match=message):
        check_upload(_upload(manifest, payload), "team-a", 1 << 20)


def test_an_upload_whose_blob_does_not_match_or_is_too_large_is_refused():
    manifest, payload = _package()
    with pytest.raises(InvalidRequest, match="digest"):
        check_upload(_upload(manifest, payload[::-1]), "", 1 << 20)
    with pytest.raises(RequestTooLarge):
        check_upload(_upload(manifest, payload), "", 10)
