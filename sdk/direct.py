"""Direct downloads: an artifact's blobs fetched from the pre-signed URLs the farm
hands out, in parallel, each checked against its digest before anything trusts it.

The manifest's signature is verified afterwards exactly as for streamed bytes
(sdk/artifact.py): a URL only says where bytes are, never what they may be. Where a
URL may point is checked when it is followed (`check_url`) and again on the addresses
each connection goes to.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import ipaddress
import logging
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.message import Message
from typing import IO, Any
from urllib.parse import urlsplit

from sdk.blobcache import BlobCache
from sdk.errors import ArtifactRejected
from torchfarm.wire.codes import Rejection

log = logging.getLogger(__name__)

PARALLEL = 8
"""Blobs downloaded at once."""

CHUNK = 1 << 20
"""Bytes read from a download at a time."""


@dataclass(frozen=True)
class Link:
    digest: str
    size: int
    url: str


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A pre-signed URL names the object itself: a redirect would send this machine's
    request wherever the store, or whoever answers as it, names."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: Message, newurl: str) -> urllib.request.Request | None:
        raise ArtifactRejected(f"the blob URL answered with a redirect (HTTP {code}); direct downloads follow none")


def check_url(url: str, loopback_ok: bool) -> None:
    """ArtifactRejected unless `url` is http(s) to a host a blob store may be on. The farm
    names the URL and this machine GETs it before any signature is checked, so a farm, or
    whoever answers as it, could aim it inside this machine's network: never at a
    link-local address (a cloud's metadata service), an unspecified or multicast one, nor
    at this machine unless the farm is on it too (`loopback_ok`: a local farm's store)."""
    parts = urlsplit(url)
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise ArtifactRejected("the farm sent a blob URL that is not http(s) to a host", Rejection.MALFORMED)
    _resolve(host, None, loopback_ok)


def _resolve(host: str, port: int | None, loopback_ok: bool) -> list[str]:
    """Every address `host` resolves to, once each, or ArtifactRejected if any is one
    `check_url` refuses: a name is as good as the address it stands for."""
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as e:
        raise ArtifactRejected(f"blob URL host {host!r} does not resolve ({e})") from e
    found = list(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in infos))
    for address in found:
        for ip in _addresses(ipaddress.ip_address(address)):
            if (
                ip.is_link_local or ip.is_unspecified or ip.is_multicast or any(ip in n for n in _METADATA)
                or (ip.is_loopback and not loopback_ok)
            ):
                raise ArtifactRejected(
                    f"blob URL host {host!r} is {ip}, which a farm's links may not name", Rejection.MALFORMED
                )
    return found


_METADATA = (ipaddress.ip_network("100.64.0.0/10"), ipaddress.ip_network("fd00:ec2::254/128"))
"""Clouds' metadata services outside link-local: Alibaba's 100.100.100.200 (in the
carriers' shared space, no blob store's), AWS's IPv6 one."""

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _addresses(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The address, and the IPv4 one an IPv6 address carries (mapped, NAT64, 6to4,
    Teredo), which is where a connection to it may end up."""
    found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _NAT64:
            found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        found += [v4 for v4 in (ip.ipv4_mapped, ip.sixtofour, ip.teredo and ip.teredo[1]) if v4 is not None]
    return found


def _connect(
    address: tuple[str, int], timeout: float | None, source_address: tuple[str, int] | None = None,
    *, loopback_ok: bool,
) -> socket.socket:
    """socket.create_connection, to the addresses of the one look-up `_resolve` checked.
    The check's own look-up is not enough: whoever answers for the host could name a
    public address to it and this machine or a metadata service to the next."""
    host, port = address
    error: OSError = OSError(f"no address for {host!r}")
    for ip in _resolve(host, port, loopback_ok):
        try:
            return socket.create_connection((ip, port), timeout, source_address)
        except OSError as e:
            error = e
    raise error


class _CheckedHTTPConnection(http.client.HTTPConnection):
    """Connects as `_connect` does; the host name stays the Host header's (and, over
    TLS, the name sent and the certificate is verified against)."""

    def __init__(self, *args: Any, loopback_ok: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # http.client opens every connection through this attribute.
        self._create_connection = functools.partial(_connect, loopback_ok=loopback_ok)


class _CheckedHTTPSConnection(_CheckedHTTPConnection, http.client.HTTPSConnection):
    pass


class _CheckedHTTP(urllib.request.HTTPHandler):
    """Opens http:// URLs on `_CheckedHTTPConnection`s."""

    def __init__(self, loopback_ok: bool):
        super().__init__()
        self.loopback_ok = loopback_ok

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        if req.has_proxy():  # the proxy looks the host up and connects (docs/security.md)
            return super().http_open(req)
        return self.do_open(_CheckedHTTPConnection, req, loopback_ok=self.loopback_ok)


class _CheckedHTTPS(urllib.request.HTTPSHandler):
    """Opens https:// URLs on `_CheckedHTTPSConnection`s (the default TLS context: the
    system's CAs, the host name checked)."""

    def __init__(self, loopback_ok: bool):
        super().__init__()
        self.loopback_ok = loopback_ok

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        if getattr(req, "_tunnel_host", None):  # through a proxy's CONNECT, as above
            return super().https_open(req)
        return self.do_open(_CheckedHTTPSConnection, req, loopback_ok=self.loopback_ok)


class _Checked:
    """`check_url` once per scheme and host, from the download threads."""

    def __init__(self, loopback_ok: bool):
        self.loopback_ok = loopback_ok
        self._hosts: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def __call__(self, url: str) -> None:
        parts = urlsplit(url)
        with self._lock:
            if (parts.scheme, parts.netloc) not in self._hosts:
                check_url(url, self.loopback_ok)
                self._hosts.add((parts.scheme, parts.netloc))


def download(link: Link, timeout_s: float, *, loopback_ok: bool) -> bytes:
    """One blob's bytes from its URL: exactly `size` bytes of the digest, or ArtifactRejected,
    also when they have not all come within about `timeout_s` (then the caller streams), or
    when the connection would go to an address `check_url` refuses."""
    if urlsplit(link.url).scheme not in ("http", "https"):
        raise ArtifactRejected(f"blob {link.digest[:19]}: the farm sent a URL that is not http(s)")
    digest, parts, got = hashlib.sha256(), [], 0
    deadline = time.monotonic() + timeout_s
    # Built for each blob, as cheap as its request: HTTP(S)_PROXY as the process has it now.
    opener = urllib.request.build_opener(_NoRedirects, _CheckedHTTP(loopback_ok), _CheckedHTTPS(loopback_ok))
    with opener.open(link.url, timeout=timeout_s) as reply:
        # Hashed as it arrives, not in a pass after: the digest costs no wall time of its own.
        # read1 returns what has come, so a store that sends a byte at a time meets the deadline.
        while got <= link.size and (part := reply.read1(min(CHUNK, link.size + 1 - got))):
            digest.update(part)
            parts.append(part)
            got += len(part)
            if time.monotonic() > deadline and got < link.size:
                raise ArtifactRejected(f"blob {link.digest[:19]}: not downloaded within {timeout_s:g} s")
    if got != link.size:
        raise ArtifactRejected(f"blob {link.digest[:19]}: {got} bytes, expected {link.size}")
    if "sha256:" + digest.hexdigest() != link.digest:
        raise ArtifactRejected(f"blob {link.digest[:19]}: downloaded bytes do not match the digest")
    return b"".join(parts)


def download_all(
    links: list[Link], timeout_s: float, cache: BlobCache | None = None, *, loopback_ok: bool
) -> dict[str, bytes]:
    """Every link's blob by digest, through this machine's blob cache when there is one.
    A blob not in the cache is downloaded once its URL passes `check_url`: one the cache
    has needs no look-up of its host (an offline node's)."""
    checked = _Checked(loopback_ok)

    def fetch(link: Link) -> bytes:
        checked(link.url)
        return download(link, timeout_s, loopback_ok=loopback_ok)

    def one(link: Link) -> bytes:
        if cache is None:
            return fetch(link)
        return cache.get(link.digest, lambda: fetch(link))

    with ThreadPoolExecutor(max_workers=min(PARALLEL, max(len(links), 1))) as pool:
        return dict(zip((l.digest for l in links), pool.map(one, links), strict=True))
