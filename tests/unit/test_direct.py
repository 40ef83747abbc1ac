"""Direct downloads from pre-signed URLs (moto's S3): the bytes are checked against the
digest and size before anything trusts them, whatever the URL served."""

from __future__ import annotations

import hashlib
import http.server
import threading
import time

import pytest
import redis

from sdk.blobcache import BlobCache
from sdk.direct import Link, download, download_all
from sdk.errors import ArtifactRejected
from tests.tls import make_pki
from torchfarm.storage.blobs import open_blobs


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def s3(s3_blob_url, redis_url):
    blobs = open_blobs(s3_blob_url.replace("/farm?", "/direct?"), redis.Redis.from_url(redis_url))
    yield blobs
    for info in list(blobs.list()):
        blobs.delete(info.digest)


def test_blobs_download_in_parallel_through_the_node_cache(s3, tmp_path):
    datas = [bytes([i]) * (1000 + i) for i in range(5)]
    links = []
    for data in datas:
        s3.put(digest_of(data), data)
        links.append(Link(digest_of(data), len(data), s3.presign(digest_of(data), 60)))
    cache = BlobCache(tmp_path, 1 << 20)
    got = download_all(links, 10, cache, loopback_ok=True)
    assert got == {digest_of(d): d for d in datas}
    assert len(cache.entries()) == 5


def test_bytes_at_the_url_that_do_not_match_the_digest_are_refused(s3, tmp_path):
    real = b"the real kernel"
    evil = b"the evil kernel"  # same size, other bytes: what a tampered bucket serves
    s3.s3.put_object(Bucket=s3.bucket, Key=s3._key(digest_of(real)), Body=evil)
    link = Link(digest_of(real), len(real), s3.presign(digest_of(real), 60))
    with pytest.raises(ArtifactRejected, match="digest"):
        download(link, 10, loopback_ok=True)
    with pytest.raises(ArtifactRejected):
        download_all([link], 10, BlobCache(tmp_path, 1 << 20), loopback_ok=True)
    assert BlobCache(tmp_path, 1 << 20).entries() == []  # nothing bad was cached


def test_a_url_serving_more_or_fewer_bytes_than_the_manifest_says_is_refused(s3):
    data = b"x" * 100
    s3.put(digest_of(data), data)
    url = s3.presign(digest_of(data), 60)
    for size in (99, 101):
        with pytest.raises(ArtifactRejected, match="bytes"):
            download(Link(digest_of(data), size, url), 10, loopback_ok=True)


def test_a_url_that_is_not_http_is_refused_before_it_is_opened():
    with pytest.raises(ArtifactRejected, match="http"):
        download(Link(digest_of(b""), 0, "file:///etc/passwd"), 10, loopback_ok=True)


BODY = b"0123456789abcdef"


class _Store(http.server.BaseHTTPRequestHandler):
    """An object store that redirects (/redirect) or sends one byte every 0.3 s (/trickle)."""

    seen: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append(self.path)
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/internal?action=delete")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        try:
            for byte in BODY:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                if self.path == "/trickle":
                    time.sleep(0.3)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up at its deadline, as it should


@pytest.fixture
def store_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Store)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Store.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_redirect_is_not_followed(store_url):
    """The URL says where the farm's bytes are; a redirect would send this machine's
    request wherever the store (or whoever answers as it) names."""
    with pytest.raises(ArtifactRejected, match="redirect"):
        download(Link(digest_of(BODY), len(BODY), f"{store_url}/redirect"), 5, loopback_ok=True)
    assert _Store.seen == ["/redirect"]


def test_a_download_ends_at_its_deadline_however_slowly_bytes_come(store_url):
    assert download(Link(digest_of(BODY), len(BODY), f"{store_url}/fast"), 5, loopback_ok=True) == BODY
    started = time.monotonic()
    with pytest.raises(ArtifactRejected, match="within 1"):
        download(Link(digest_of(BODY), len(BODY), f"{store_url}/trickle"), 1.0, loopback_ok=True)
    assert time.monotonic() - started < 3  # 16 bytes at 0.3 s each would take 4.8 s


@pytest.mark.parametrize("host", ["localhost", "blobs.example"])
def test_https_to_a_checked_address_still_names_and_verifies_the_urls_host(tmp_path, monkeypatch, host):
    # The connection goes to the address the check approved; TLS still sends the URL's
    # host and verifies the store's certificate (127.0.0.1's and localhost's) against it.
    import socket
    import ssl

    pki = make_pki(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki["server_cert"], pki["server_key"])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Store)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda name, *a, **k: real("127.0.0.1" if name == host else name, *a, **k))
    monkeypatch.setenv("SSL_CERT_FILE", str(pki["ca"]))
    for name in ("https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    link = Link(digest_of(BODY), len(BODY), f"https://{host}:{server.server_address[1]}/fast")
    try:
        if host == "localhost":
            assert download(link, 5, loopback_ok=True) == BODY
        else:
            with pytest.raises(OSError, match="Hostname mismatch"):
                download(link, 5, loopback_ok=True)
    finally:
        server.shutdown()
