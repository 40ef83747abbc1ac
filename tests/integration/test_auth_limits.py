"""Tokens and limits on the wire (issue 16, item 7): a real gRPC coordinator over a
real redis-server, Celery replaced by a recorder."""

from __future__ import annotations

import grpc
import pytest

from tests.coordinator_server import token_farms, write_token_table
from tests.requests import relu_request
from torchfarm.trust import tokens
from torchfarm.v1 import farm_pb2

pytestmark = pytest.mark.integration


@pytest.fixture
def make_farm(store, tmp_path, redis_url):
    """Starts a coordinator with the token table given; yields (address, tokens file)."""
    with token_farms(store, tmp_path, redis_url) as start:
        yield start


def _submit(address: str, token: str | None, request: bytes | None = None):
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 1 << 30)]) as ch:
        call = ch.unary_unary(
            "/torchfarm.v1.CompileFarm/Submit",
            request_serializer=None, response_deserializer=farm_pb2.SubmitReply.FromString,
        )
        md = (("authorization", f"Bearer {token}"),) if token is not None else None
        return call(request if request is not None else relu_request().SerializeToString(),
                    timeout=20, metadata=md)


def _refused(fn) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    reason = dict(info.value.trailing_metadata() or ()).get("torchfarm-reason", "")
    return info.value.code(), reason, info.value.details()


def test_a_revoked_token_stops_working_without_a_restart(make_farm):
    alice, bob = tokens.new_token("alice"), tokens.new_token("bob")
    address, path = make_farm({**tokens.table_entry(alice, "alice"), **tokens.table_entry(bob, "bob")})
    assert _submit(address, alice).key
    write_token_table(path, tokens.table_entry(bob, "bob"))  # the operator removes alice's line
    code, reason, _ = _refused(lambda: _submit(address, alice))
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
    assert _submit(address, bob).key
    carol = tokens.new_token("carol")  # and a new one works at once
    write_token_table(path, {**tokens.table_entry(bob, "bob"), **tokens.table_entry(carol, "carol")})
    assert _submit(address, carol).key


def test_an_expired_token_is_refused(make_farm):
    old, fresh = tokens.new_token("alice"), tokens.new_token("alice")
    address, _ = make_farm({
        **tokens.table_entry(old, "alice", expires=1_000_000),
        **tokens.table_entry(fresh, "alice", expires=tokens.default_expiry()),
    })
    code, _, details = _refused(lambda: _submit(address, old))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "expired" in details
    assert _submit(address, fresh).key


def test_failed_attempts_are_rate_limited_per_peer(make_farm):
    good = tokens.new_token("alice")
    address, _ = make_farm(tokens.table_entry(good, "alice"), auth_failure_burst=3, auth_failure_per_s=0.0)
    for _ in range(3):
        assert _refused(lambda: _submit(address, "tf1.alice." + "A" * 43))[0] == grpc.StatusCode.UNAUTHENTICATED
    code, reason, _ = _refused(lambda: _submit(address, "tf1.alice." + "B" * 43))
    assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "AUTH_THROTTLED")
    # Failures are throttled, not tenants: a token that verifies is still admitted.
    assert _submit(address, good).key


def test_a_flood_of_bad_tokens_does_not_lock_out_a_valid_tenant_on_the_same_host(make_farm):
    """Issue 40, item 5: 900 made-up-token calls in 20 s once made 31 of another
    tenant's 32 valid calls on the same host fail AUTH_THROTTLED."""
    from concurrent.futures import ThreadPoolExecutor

    good = tokens.new_token("alice")
    address, _ = make_farm(tokens.table_entry(good, "alice"))  # the default limits

    def bad(_):
        return _refused(lambda: _submit(address, "tf1.mallory." + "A" * 43))[1]

    with ThreadPoolExecutor(8) as pool:
        reasons = list(pool.map(bad, range(200)))
    assert reasons.count("AUTH_THROTTLED") >= 150  # the flood itself is throttled
    assert all(_submit(address, good).key for _ in range(32))


def test_an_unauthenticated_request_is_not_read(make_farm):
    """A request larger than the server's receive limit, with no valid token, is
    answered UNAUTHENTICATED: grpc never read it (it would answer RESOURCE_EXHAUSTED
    "Received message larger than max" had it been read)."""
    address, _ = make_farm(tokens.table_entry(tokens.new_token("alice"), "alice"),
                           max_message_bytes=1 << 20)
    big = b"\x00" * (8 << 20)
    for token in (None, "tf1.alice." + "A" * 43):
        code, _, details = _refused(lambda t=token: _submit(address, t, big))
        assert code == grpc.StatusCode.UNAUTHENTICATED, details


def test_watch_on_the_wire_is_woken_by_the_store(make_farm, store):
    """The server wires job events: with the safety poll at an hour, a Watch stream
    still follows the job to its end."""
    import threading

    from torchfarm.storage.store import JobState
    from torchfarm.v1 import farm_pb2_grpc

    alice = tokens.new_token("alice")
    address, _ = make_farm(tokens.table_entry(alice, "alice"), watch_poll_s=3600.0, poll_interval_s=3600.0)
    key = _submit(address, alice).key
    md = (("authorization", f"Bearer {alice}"),)
    states: list[int] = []
    with grpc.insecure_channel(address) as ch:
        stream = farm_pb2_grpc.CompileFarmStub(ch).Watch(farm_pb2.JobRef(key=key), timeout=60, metadata=md)
        first = next(stream)
        states.append(first.state)
        done = threading.Event()

        def finish():
            store.tenant("alice").update_job(key, state=JobState.RUNNING, stage="lowering")
            store.tenant("alice").update_job(key, state=JobState.SUCCEEDED, stage="done")
            done.set()

        threading.Thread(target=finish).start()
        states.extend(s.state for s in stream)
    assert done.is_set() and states[0] == farm_pb2.QUEUED and states[-1] == farm_pb2.SUCCEEDED
