"""Tenant tokens: format, table, constant-time lookup."""

from __future__ import annotations

import json

import pytest

from torchfarm.trust import tokens
from torchfarm.trust.tokens import Tenant, TokenError, TokenTable


def test_new_token_names_its_namespace_and_hashes_into_the_table():
    tok = tokens.new_token("alice")
    assert tok.startswith("tf1.alice.") and len(tok.split(".")[2]) == 43
    assert tokens.namespace_of(tok) == "alice"
    table = TokenTable.from_json(json.dumps(tokens.table_entry(tok, "alice")))
    assert table.lookup(tok) == Tenant("alice", "alice")
    assert tok not in json.dumps(tokens.table_entry(tok, "alice"))  # only the hash is stored


def test_unknown_malformed_and_relabelled_tokens_are_refused():
    tok = tokens.new_token("alice")
    table = TokenTable.from_json(json.dumps(tokens.table_entry(tok, "alice")))
    assert table.lookup(tokens.new_token("alice")) is None
    assert table.lookup("") is None
    assert table.lookup("Bearer " + tok) is None
    # Same secret, other namespace in clear: a different token, so a different hash.
    assert table.lookup(tok.replace("tf1.alice.", "tf1.bob.")) is None


def test_shared_namespace_entry():
    tok = tokens.new_token("shared")
    entry = tokens.table_entry(tok, "bob")
    assert list(entry.values()) == [{"tenant": "bob", "namespace": "shared"}]
    assert TokenTable.from_json(json.dumps(entry)).lookup(tok) == Tenant("bob", "shared")


def test_token_whose_namespace_disagrees_with_the_table_is_refused():
    tok = tokens.new_token("alice")
    table = TokenTable.from_json(json.dumps({tokens.token_hash(tok): {"tenant": "x", "namespace": "bob"}}))
    assert table.lookup(tok) is None


@pytest.mark.parametrize(
    "body", ['[]', '{"nothex": "a"}', '{"' + "a" * 64 + '": 3}', '{"' + "a" * 64 + '": "Bad Name"}', "x"]
)
def test_malformed_tables_are_refused(body):
    with pytest.raises(TokenError):
        TokenTable.from_json(body)


@pytest.mark.parametrize("ns", ["", "A", "-x", "a" * 64, "a.b", "a b"])
def test_bad_namespaces(ns):
    with pytest.raises(TokenError):
        tokens.new_token(ns)


def test_an_expired_token_is_refused_and_says_so():
    tok = tokens.new_token("alice")
    table = TokenTable.from_json(json.dumps(tokens.table_entry(tok, "alice", expires=1000.0)))
    assert table.lookup(tok, now=999.0) == Tenant("alice", "alice")
    assert table.lookup(tok, now=1000.0) is None
    with pytest.raises(tokens.TokenRefused) as info:
        table.check(tok, now=1001.0)
    assert info.value.reason == "expired"
    with pytest.raises(tokens.TokenRefused) as info:
        table.check(tokens.new_token("alice"), now=0.0)
    assert info.value.reason == "invalid"


def test_entries_without_expiry_stay_valid_and_bad_expiries_are_refused():
    tok = tokens.new_token("alice")
    assert TokenTable.from_json(json.dumps({tokens.token_hash(tok): "alice"})).lookup(tok, now=1e12)
    for bad in ("soon", -1, True):
        body = {tokens.token_hash(tok): {"tenant": "alice", "expires": bad}}
        with pytest.raises(TokenError):
            TokenTable.from_json(json.dumps(body))


def test_a_new_token_expires_by_default():
    tok = tokens.new_token("alice")
    entry = tokens.table_entry(tok, "alice", expires=tokens.default_expiry(now=0.0))
    value = next(iter(entry.values()))
    assert value["expires"] == tokens.DEFAULT_TOKEN_DAYS * 86400


def test_the_token_command_prints_the_token_once_and_writes_only_its_hash(tmp_path, capsys):
    import time

    from cli import main as cli

    path = tmp_path / "tokens.json"
    earlier = tokens.new_token("bob")
    path.write_text(json.dumps(tokens.table_entry(earlier, "bob")))
    assert cli.main(["token", "alice", "--tokens-file", str(path), "--days", "1"]) == 0
    out = capsys.readouterr().out
    printed = [w for w in out.split() if w.startswith("tf1.alice.")]
    assert len(printed) == 1
    tok = printed[0]
    text = path.read_text()
    assert tok not in text and tokens.token_hash(tok) in text
    assert path.stat().st_mode & 0o777 == 0o600
    table = TokenTable.from_file(path)
    assert table.lookup(tok) == Tenant("alice", "alice") and table.lookup(earlier)  # merged
    assert table.lookup(tok, now=time.time() + 86400 + 60) is None  # expires in a day
