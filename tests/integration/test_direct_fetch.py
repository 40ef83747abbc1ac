"""FetchArtifact with direct downloads, on a real coordinator (no Celery) whose blobs are
in moto's S3: links instead of bytes, the SDK's checks, and the fallback to the stream."""

from __future__ import annotations

import os
import time

import pytest

import sdk.client
from localfarm.fakes import InlineDispatcher
from localfarm.stack import free_port
from sdk.client import FarmClient
from sdk.errors import ArtifactRejected
from sdk.settings import SDKSettings
from services.coordinator.settings import CoordinatorSettings
from tests.coordinator_server import running_coordinator
from torchfarm.storage.store import Store
from torchfarm.v1 import farm_pb2
from torchfarm.wire.manifest import BlobRef, Manifest, blob_digest

pytestmark = pytest.mark.integration


@pytest.fixture
def farm(redis_url, s3_blob_url):
    blob_url = s3_blob_url.replace("/farm?", "/direct-fetch?")
    store = Store.from_url(redis_url, blob_url=blob_url)
    store.r.flushall()
    settings = CoordinatorSettings(listen=f"127.0.0.1:{free_port()}", cache_url=redis_url, blob_url=blob_url)
    with running_coordinator(settings, InlineDispatcher()):
        yield f"grpc://{settings.listen}", store
    store.r.flushall()


def put_artifact(store: Store, data: bytes) -> str:
    ref = BlobRef(blob_digest(data), len(data))
    store.put_blob(ref.digest, data)
    key = blob_digest(data).split(":")[1]
    store.put_manifest(Manifest(key=key, fingerprint={}, payload=ref, created=time.time()))
    return key


def test_a_direct_fetch_sends_links_and_no_bytes(farm, tmp_path):
    address, store = farm
    data = os.urandom(3 << 20)
    key = put_artifact(store, data)
    client = FarmClient(address, SDKSettings(blob_cache_dir=str(tmp_path)))
    chunks = list(client.stub.FetchArtifact(farm_pb2.ArtifactRef(key=key, direct=True)))
    kinds = [c.WhichOneof("kind") for c in chunks]
    assert kinds == ["manifest", "link"]
    assert chunks[1].link.size == len(data) and chunks[1].link.url.startswith("http://127.0.0.1:")
    # Without `direct`, an older client gets the stream as before.
    kinds = {c.WhichOneof("kind") for c in client.stub.FetchArtifact(farm_pb2.ArtifactRef(key=key))}
    assert kinds == {"manifest", "blob"}
    _, blobs = client.fetch(key)
    assert blobs == {blob_digest(data): data}


def test_a_failed_direct_download_falls_back_to_the_stream(farm, tmp_path, monkeypatch):
    address, store = farm
    data = b"payload" * 1000
    key = put_artifact(store, data)

    def unreachable(*args, **kwargs):
        raise ConnectionRefusedError("store endpoint unreachable from this client")

    monkeypatch.setattr(sdk.client, "download_all", unreachable)
    _, blobs = FarmClient(address, SDKSettings(blob_cache_dir=str(tmp_path))).fetch(key)
    assert blobs == {blob_digest(data): data}


def test_tampered_bytes_in_the_bucket_are_never_returned(farm, tmp_path):
    address, store = farm
    real = b"real kernel bytes"
    key = put_artifact(store, real)
    s3 = store.blobs
    s3.s3.put_object(Bucket=s3.bucket, Key=s3._key(blob_digest(real)), Body=b"evil kernel bytes")
    with pytest.raises(ArtifactRejected):
        FarmClient(address, SDKSettings(blob_cache_dir=str(tmp_path))).fetch(key)
    # The stream found the bad blob too, and dropped the manifest: the key recompiles.
    assert store.get_manifest_bytes(key) is None
