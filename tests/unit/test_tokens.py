"""Tenant tokens: format, table, constant-time lookup."""

from __future__ import annotations

import json

import pytest

from torchfarm import tokens
from torchfarm.tokens import Tenant, TokenError, TokenTable


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
