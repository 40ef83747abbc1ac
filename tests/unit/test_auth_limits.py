"""The coordinator's token file, reloaded on change, and the limit on failed
attempts (issue 16, item 7). No server: a fake clock and files in tmp_path."""

from __future__ import annotations

import json
import os

import grpc
import pytest

from services.coordinator import auth
from services.coordinator.proxies import TrustedProxies, bucket_of
from services.coordinator.ratelimit import TokenBuckets, peer_host
from services.coordinator.tokensource import TokenSource
from torchfarm.trust import tokens


def _write(path, *pairs) -> None:
    table: dict = {}
    for tok, tenant in pairs:
        table.update(tokens.table_entry(tok, tenant))
    tmp = path.with_suffix(".new")
    tmp.write_text(json.dumps(table))
    os.replace(tmp, path)  # as an operator should: a new inode, never a half-written file


def test_a_revoked_token_is_refused_without_a_restart(tmp_path):
    alice, bob = tokens.new_token("alice"), tokens.new_token("bob")
    path = tmp_path / "tokens.json"
    _write(path, (alice, "alice"), (bob, "bob"))
    source = TokenSource(str(path), check_every_s=0.0)
    assert source.table().lookup(alice) and source.table().lookup(bob)
    _write(path, (bob, "bob"))  # alice revoked
    assert source.table().lookup(alice) is None
    assert source.table().lookup(bob)


def test_an_edit_in_place_is_seen_too(tmp_path):
    alice = tokens.new_token("alice")
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(tokens.table_entry(alice, "alice")))
    source = TokenSource(str(path), check_every_s=0.0)
    assert source.table().lookup(alice)
    st = path.stat()
    path.write_text(json.dumps({}))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a coarse clock
    assert source.table().lookup(alice) is None


def test_a_broken_or_missing_file_admits_no_one(tmp_path):
    alice = tokens.new_token("alice")
    path = tmp_path / "tokens.json"
    _write(path, (alice, "alice"))
    source = TokenSource(str(path), check_every_s=0.0)
    assert source.table().lookup(alice)
    path.write_text("{not json")
    assert source.table().lookup(alice) is None
    path.unlink()
    assert source.table().lookup(alice) is None
    _write(path, (alice, "alice"))
    assert source.table().lookup(alice)


def test_the_file_is_checked_at_most_every_interval(tmp_path):
    now = [100.0]
    alice = tokens.new_token("alice")
    path = tmp_path / "tokens.json"
    _write(path, (alice, "alice"))
    source = TokenSource(str(path), check_every_s=1.0, clock=lambda: now[0])
    assert source.table().lookup(alice)
    _write(path)
    assert source.table().lookup(alice)  # not yet looked at again
    now[0] += 1.5
    assert source.table().lookup(alice) is None


def test_failed_attempts_drain_a_per_peer_bucket_that_refills():
    now = [0.0]
    limiter = TokenBuckets(burst=3, per_s=0.5, clock=lambda: now[0])
    for _ in range(3):
        assert limiter.allowed("10.0.0.1")
        limiter.failed("10.0.0.1")
    assert not limiter.allowed("10.0.0.1")
    assert limiter.allowed("10.0.0.2")  # another peer is not affected
    now[0] += 2.0  # one attempt's worth
    assert limiter.allowed("10.0.0.1")
    limiter.failed("10.0.0.1")
    assert not limiter.allowed("10.0.0.1")


def test_the_limiter_forgets_peers_beyond_its_size():
    limiter = TokenBuckets(burst=1, per_s=0.0, max_peers=2, clock=lambda: 0.0)
    for peer in ("a", "b", "c"):
        limiter.failed(peer)
    assert len(limiter) == 2


@pytest.mark.parametrize(
    "peer, host",
    [("ipv4:10.1.2.3:5555", "10.1.2.3"), ("ipv6:[::1]:5555", "::1"), ("unix:/tmp/s", "unix:/tmp/s")],
)
def test_peer_host_drops_the_port(peer, host):
    assert peer_host(peer) == host


class _Details:
    def __init__(self, metadata=()):
        self.method = "/torchfarm.v1.CompileFarm/Submit"
        self.invocation_metadata = metadata


def test_an_unauthenticated_call_never_reads_its_request(tmp_path):
    """grpc.aio reads a unary request whole (up to max_receive_message_length) before
    it calls the handler; a request-streaming handler reads nothing until it iterates.
    So the refusal is a request-streaming handler that never does."""
    import asyncio

    path = tmp_path / "tokens.json"
    _write(path, (tokens.new_token("alice"), "alice"))
    interceptor = auth.AuthInterceptor(TokenSource(str(path)))

    async def continuation(details):
        async def behavior(request, context):  # pragma: no cover - must not run
            raise AssertionError("the servicer ran")

        return grpc.unary_unary_rpc_method_handler(behavior)

    handler = asyncio.run(interceptor.intercept_service(continuation, _Details()))
    assert handler.request_streaming

    class Context:
        code = None

        def peer(self):
            return "ipv4:127.0.0.1:1"

        async def abort(self, code, details, trailing_metadata=()):
            self.code = code
            raise grpc.RpcError()

    class Requests:
        read = False

        def __aiter__(self):
            return self

        async def __anext__(self):
            self.read = True
            raise StopAsyncIteration

    requests, context = Requests(), Context()
    with pytest.raises(grpc.RpcError):
        asyncio.run(handler.stream_unary(requests, context))
    assert context.code == grpc.StatusCode.UNAUTHENTICATED and not requests.read


# Issue 40, item 5: throttle failures, not tenants.


class _Ctx:
    """A grpc.aio servicer context as the interceptor's handlers use it."""

    def __init__(self, peer: str, metadata=()):
        self._peer, self._metadata = peer, tuple(metadata)
        self.code = self.reason = None

    def peer(self):
        return self._peer

    def invocation_metadata(self):
        return self._metadata

    async def abort(self, code, details, trailing_metadata=()):
        self.code, self.reason = code, dict(trailing_metadata).get(auth.REASON_KEY)
        raise grpc.RpcError(details)


class _NoRequests:
    def __aiter__(self):
        return self

    async def __anext__(self):
        raise StopAsyncIteration


def _call(interceptor, token, peer, metadata=()):
    """One unary call through the interceptor: "ok" when the servicer ran, else the
    reason it was refused with."""
    import asyncio

    async def continuation(details):
        async def behavior(request, context):
            return "ok"

        return grpc.unary_unary_rpc_method_handler(behavior)

    md = tuple(metadata) + ((("authorization", f"Bearer {token}"),) if token else ())
    handler = asyncio.run(interceptor.intercept_service(continuation, _Details(md)))
    context = _Ctx(peer, md)
    try:
        if handler.request_streaming:
            return asyncio.run(handler.stream_unary(_NoRequests(), context))
        return asyncio.run(handler.unary_unary(b"", context))
    except grpc.RpcError:
        return context.reason


def _interceptor(tmp_path, *pairs, trusted=()):
    path = tmp_path / "tokens.json"
    _write(path, *pairs)
    return auth.AuthInterceptor(
        TokenSource(str(path)), TokenBuckets(burst=3, per_s=0.0, clock=lambda: 0.0),
        trusted_proxies=TrustedProxies.parse(trusted),
    )


def test_a_valid_token_is_never_throttled_by_others_failures(tmp_path):
    """A made-up token's flood from a host once locked every tenant on that host out:
    the throttle ran before the token was looked at, valid or not."""
    alice = tokens.new_token("alice")
    interceptor = _interceptor(tmp_path, (alice, "alice"))
    bad = "tf1.mallory." + "A" * 43
    answers = [_call(interceptor, bad, "ipv4:10.0.0.9:4000") for _ in range(10)]
    assert answers[:3] == ["UNAUTHENTICATED"] * 3
    assert set(answers[3:]) == {"AUTH_THROTTLED"}
    assert [_call(interceptor, alice, "ipv4:10.0.0.9:4001") for _ in range(5)] == ["ok"] * 5


def test_failures_naming_a_tenant_throttle_that_name_from_every_address(tmp_path):
    """Limits are keyed by address and by the tenant a token names: guesses at alice's
    token from many addresses run dry, and alice's own valid calls still pass."""
    alice = tokens.new_token("alice")
    interceptor = _interceptor(tmp_path, (alice, "alice"))
    guesses = [_call(interceptor, "tf1.alice." + "A" * 43, f"ipv4:10.0.1.{i}:1") for i in range(6)]
    assert guesses[:3] == ["UNAUTHENTICATED"] * 3 and set(guesses[3:]) == {"AUTH_THROTTLED"}
    assert _call(interceptor, "tf1.bob." + "A" * 43, "ipv4:10.0.1.200:1") == "UNAUTHENTICATED"
    assert _call(interceptor, alice, "ipv4:10.0.1.1:1") == "ok"


def test_the_forwarded_address_counts_only_behind_a_trusted_proxy(tmp_path):
    alice = tokens.new_token("alice")
    interceptor = _interceptor(tmp_path, (alice, "alice"), trusted=("10.9.0.0/16",))
    proxy = "ipv4:10.9.0.2:443"
    bad = "tf1.mallory." + "A" * 43
    for _ in range(3):
        assert _call(interceptor, bad, proxy, [("x-forwarded-for", "198.51.100.7")]) == "UNAUTHENTICATED"
    assert _call(interceptor, bad, proxy, [("x-forwarded-for", "198.51.100.7")]) == "AUTH_THROTTLED"
    # Another client behind the same proxy has its own bucket...
    assert _call(interceptor, "tf1.eve." + "A" * 43, proxy,
                 [("x-forwarded-for", "198.51.100.8")]) == "UNAUTHENTICATED"
    # ...and an untrusted peer's header is ignored: it cannot pose as a fresh address.
    direct = "ipv4:203.0.113.5:1"
    for i in range(3):
        _call(interceptor, "tf1.eve2." + "A" * 43, direct, [("x-forwarded-for", f"192.0.2.{i}")])
    assert _call(interceptor, "tf1.eve3." + "A" * 43, direct,
                 [("x-forwarded-for", "192.0.2.99")]) == "AUTH_THROTTLED"


@pytest.mark.parametrize(
    "peer, header, client",
    [
        ("10.9.0.2", "198.51.100.7", "198.51.100.7"),
        ("10.9.0.2", "192.0.2.1, 198.51.100.7", "198.51.100.7"),  # the left is the client's claim
        ("10.9.0.2", "198.51.100.7, 10.9.0.3", "198.51.100.7"),  # a chain of trusted proxies
        ("10.9.0.2", "not-an-address", "10.9.0.2"),
        ("10.9.0.2", "", "10.9.0.2"),
        ("203.0.113.5", "198.51.100.7", "203.0.113.5"),  # not a trusted proxy
        ("2001:db8::1", "198.51.100.7", "2001:db8::1"),
        ("::ffff:10.9.0.2", "198.51.100.7", "198.51.100.7"),  # an IPv4 proxy on a dual-stack socket
    ],
)
def test_the_client_address_behind_trusted_proxies(peer, header, client):
    trusted = TrustedProxies.parse(("10.9.0.0/16",))
    assert trusted.client(peer, header) == client


def test_a_trusted_proxy_setting_that_does_not_parse_is_refused():
    with pytest.raises(ValueError, match="TORCHFARM_TRUSTED_PROXIES"):
        TrustedProxies.parse(("10.9.0.0/33",))


def test_ipv6_failures_count_against_the_clients_64(tmp_path):
    """A host holds a whole /64: a fresh address (and a fresh made-up tenant) per guess
    must not mean a fresh bucket."""
    assert bucket_of("2001:db8:1:2::5") == bucket_of("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert bucket_of("2001:db8:1:3::5") != bucket_of("2001:db8:1:2::5")
    assert bucket_of("10.0.0.1") == "10.0.0.1" and bucket_of("unix:/tmp/s") == "unix:/tmp/s"
    interceptor = _interceptor(tmp_path, (tokens.new_token("alice"), "alice"))
    answers = [_call(interceptor, f"tf1.t{i}." + "A" * 43, f"ipv6:[2001:db8:1:2::{i:x}]:1") for i in range(5)]
    assert answers[:3] == ["UNAUTHENTICATED"] * 3 and set(answers[3:]) == {"AUTH_THROTTLED"}
