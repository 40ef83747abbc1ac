"""The links a farm puts in a FetchArtifact stream are followed only when the client asked
for direct downloads, and only to hosts a blob store may be on: a farm (or whoever answers
as it) must not make training nodes send requests to addresses of their own network."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.server
import threading
from collections.abc import Iterator

import pytest

from sdk import direct
from sdk.client import StubClient
from sdk.errors import ArtifactRejected
from sdk.settings import SDKSettings
from torchfarm.v1 import farm_pb2
from torchfarm.wire.codes import Rejection

BODY = b"the blob's bytes"
DIGEST = "sha256:" + hashlib.sha256(BODY).hexdigest()


class _Host(http.server.BaseHTTPRequestHandler):
    """Any HTTP service on this machine; records what it was asked."""

    seen: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)


@contextlib.contextmanager
def _serving(handler: type[http.server.BaseHTTPRequestHandler],
             server: type[http.server.ThreadingHTTPServer] = http.server.ThreadingHTTPServer) -> Iterator[int]:
    """`handler` (a `_Host`) answering on 127.0.0.1 from a thread of its own, with what
    `_Host` saw emptied first; its port."""
    running = server(("127.0.0.1", 0), handler)
    threading.Thread(target=running.serve_forever, daemon=True).start()
    _Host.seen = []
    try:
        yield running.server_address[1]
    finally:
        running.shutdown()


@pytest.fixture
def local_url():
    with _serving(_Host) as port:
        yield f"http://127.0.0.1:{port}"


class _Farm:
    """A FetchArtifact that sends a link to `url`, even when none was asked for, and the
    blob's bytes only on a stream that asked for none."""

    def __init__(self, url: str, links_always: bool = False):
        self.url, self.links_always, self.asked = url, links_always, []

    def FetchArtifact(self, ref, timeout=None, metadata=None):  # noqa: N802 - the stub's name
        self.asked.append(ref.direct)
        yield farm_pb2.ArtifactChunk(manifest=b"{}")
        if ref.direct or self.links_always:
            yield farm_pb2.ArtifactChunk(link=farm_pb2.BlobLink(digest=DIGEST, size=len(BODY), url=self.url))
        else:
            yield farm_pb2.ArtifactChunk(blob=farm_pb2.BlobChunk(digest=DIGEST, offset=0, data=BODY))


def _client(address: str, stub: _Farm, ask_direct: bool) -> StubClient:
    settings = dataclasses.replace(SDKSettings(), direct_downloads=ask_direct, blob_cache_dir="", fetch_timeout_s=5.0)
    return StubClient(address, settings, stub)


def test_a_link_the_client_did_not_ask_for_is_refused_unfollowed(local_url):
    stub = _Farm(f"{local_url}/admin/delete?everything=1", links_always=True)
    with pytest.raises(ArtifactRejected, match="did not ask") as e:
        _client("127.0.0.1:50051", stub, ask_direct=False).fetch("ab" * 32)
    assert e.value.code == Rejection.MALFORMED and e.value.fallback
    assert _Host.seen == []


def test_a_remote_farms_link_to_this_machine_is_not_followed_and_the_blob_is_streamed(local_url):
    stub = _Farm(f"{local_url}/blob")
    _, blobs = _client("farm.example:50051", stub, ask_direct=True).fetch("ab" * 32)
    assert blobs == {DIGEST: BODY}
    assert stub.asked == [True, False]  # the direct stream, then the plain one
    assert _Host.seen == []


def test_a_local_farms_link_to_its_local_store_is_followed(local_url):
    stub = _Farm(f"{local_url}/blob")
    _, blobs = _client("127.0.0.1:50051", stub, ask_direct=True).fetch("ab" * 32)
    assert blobs == {DIGEST: BODY}
    assert stub.asked == [True] and _Host.seen == ["/blob"]


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/",  # a cloud's metadata service
    "http://[fe80::1]/x",
    "http://0.0.0.0:9000/x",  # connects to this machine
    "http://[::ffff:169.254.169.254]/x",
    "http://224.0.0.1/x",
    # Metadata services outside link-local: AWS's IPv6 one, Alibaba's (shared address
    # space), and 169.254.169.254 through NAT64 and 6to4.
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://100.100.100.200/latest/meta-data/",
    "http://[64:ff9b::a9fe:a9fe]/x",
    "http://[2002:a9fe:a9fe::1]/x",
])
def test_link_local_and_unspecified_hosts_are_refused_even_for_a_local_farm(url):
    with pytest.raises(ArtifactRejected, match="may not"):
        direct.check_url(url, loopback_ok=True)


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9000/x", "http://localhost/x", "http://[::1]/x", "http://127.1/x",
    "http://[::ffff:127.0.0.1]/x",
])
def test_this_machine_is_refused_unless_the_farm_is_on_it_too(url):
    with pytest.raises(ArtifactRejected, match="may not"):
        direct.check_url(url, loopback_ok=False)
    direct.check_url(url, loopback_ok=True)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://store/x", "gopher://store/x", "http:///x"])
def test_only_http_urls_with_a_host_are_followed(url):
    with pytest.raises(ArtifactRejected, match="http"):
        direct.check_url(url, loopback_ok=True)


def test_a_store_on_another_host_is_allowed():
    direct.check_url("https://10.0.0.5:9000/bucket/blob?X-Amz-Signature=abc", loopback_ok=False)


def test_a_blob_this_machine_has_needs_no_look_up_of_its_links_host(tmp_path, monkeypatch):
    # An offline node, or one that reaches the store only through a proxy, takes a
    # cached blob from its cache; looking the host up first failed there and streamed
    # the whole artifact through the coordinator again.
    from sdk.blobcache import BlobCache

    BlobCache(tmp_path, 1 << 20).get(DIGEST, lambda: BODY)
    looked_up = []
    monkeypatch.setattr(direct.socket, "getaddrinfo", lambda *a, **k: looked_up.append(a) or [])
    stub = _Farm("http://store.invalid/blob")
    settings = dataclasses.replace(SDKSettings(), direct_downloads=True, blob_cache_dir=str(tmp_path))
    _, blobs = StubClient("farm.example:50051", settings, stub).fetch("ab" * 32)
    assert blobs == {DIGEST: BODY}
    assert stub.asked == [True] and looked_up == []


class _Rebinding:
    """A resolver whose answer for `name` changes after the first look-up: a public
    address while the link is checked, this machine when the download connects."""

    def __init__(self, name: str, monkeypatch: pytest.MonkeyPatch):
        self.name, self.real, self.answers = name, direct.socket.getaddrinfo, 0
        monkeypatch.setattr(direct.socket, "getaddrinfo", self)

    def __call__(self, host, port, *args, **kwargs):
        if host != self.name:
            return self.real(host, port, *args, **kwargs)
        self.answers += 1
        ip = "203.0.113.7" if self.answers == 1 else "127.0.0.1"
        return [(direct.socket.AF_INET, direct.socket.SOCK_STREAM, direct.socket.IPPROTO_TCP, "", (ip, port or 0))]


class _Listener(http.server.ThreadingHTTPServer):
    """`_Host`, also counting connections: a TLS hello never becomes a GET."""

    connections = 0

    def verify_request(self, request, client_address) -> bool:
        _Listener.connections += 1
        return True


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_host_that_resolves_elsewhere_when_the_download_connects_is_refused(monkeypatch, scheme):
    # Whoever answers for the link's host names a public address to the check, then this
    # machine (or a metadata service) to the connection that follows.
    _Listener.connections = 0
    with _serving(_Host, _Listener) as port:
        resolver = _Rebinding("blobs.example", monkeypatch)
        stub = _Farm(f"{scheme}://blobs.example:{port}/blob")
        _, blobs = _client("farm.example:50051", stub, ask_direct=True).fetch("ab" * 32)
    assert resolver.answers >= 2 and _Listener.connections == 0 and _Host.seen == []
    assert blobs == {DIGEST: BODY}
    assert stub.asked == [True, False]  # refused, then streamed


def test_a_host_that_resolves_elsewhere_when_the_download_connects_is_refused_as_a_link(monkeypatch, local_url):
    port = local_url.rpartition(":")[2]
    _Rebinding("blobs.example", monkeypatch)
    link = direct.Link(DIGEST, len(BODY), f"http://blobs.example:{port}/blob")
    with pytest.raises(ArtifactRejected, match="is 127.0.0.1, which a farm's links may not name") as e:
        direct.download_all([link], 5, None, loopback_ok=False)
    assert e.value.code == Rejection.MALFORMED
    assert _Host.seen == []


class _Proxy(_Host):
    """A forward proxy on this machine: records each request (a CONNECT too) and answers
    a GET with the blob."""

    def do_CONNECT(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append(f"CONNECT {self.path}")
        self.send_response(502)
        self.end_headers()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_through_a_proxy_this_machine_connects_to_the_proxy(monkeypatch, scheme):
    # The proxy (here on loopback, which a remote farm's link may not name) looks the
    # store's host up and connects; this machine checks its own look-up of the host.
    for name in ("no_proxy", "NO_PROXY", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with _serving(_Proxy) as port:
        monkeypatch.setenv(f"{scheme}_proxy", f"http://127.0.0.1:{port}")
        _Rebinding("blobs.example", monkeypatch)
        stub = _Farm(f"{scheme}://blobs.example/blob")
        _, blobs = _client("farm.example:50051", stub, ask_direct=True).fetch("ab" * 32)
    assert blobs == {DIGEST: BODY}
    if scheme == "http":
        assert _Host.seen == ["http://blobs.example/blob"] and stub.asked == [True]
    else:  # this proxy refuses tunnels: the blob is streamed
        assert _Host.seen == ["CONNECT blobs.example:443"] and stub.asked == [True, False]
