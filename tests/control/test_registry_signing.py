"""Registry record signatures: what a valid signature binds, and where the key comes from."""

from __future__ import annotations

from tidemark.control.registry_signing import HEADER, headers, signing_key, verified


def test_a_signature_binds_the_key_the_value_and_the_secret():
    key = signing_key(None, "token-a")
    signed = headers(key, b"p", b"{}")
    assert verified(key, b"p", b"{}", signed)
    assert not verified(key, b"q", b"{}", signed)  # replayed under another pipeline's key
    assert not verified(key, b"p", b"{ }", signed)  # value changed
    assert not verified(key, b"p", None, signed)  # turned into a tombstone
    assert not verified(signing_key(None, "token-b"), b"p", b"{}", signed)
    assert not verified(key, b"p", b"{}", None) and not verified(key, b"p", b"{}", [(HEADER, None)])
    assert not verified(key, b"p", b"{}", signed + signed)  # two signatures: ambiguous
    assert verified(key, b"p", None, headers(key, b"p", None))


def test_the_key_is_explicit_or_derived_from_the_token_or_the_dev_key():
    assert signing_key("k", "t").secret == b"k"
    derived = signing_key(None, "t")
    assert derived.secret not in (b"t", signing_key(None, "u").secret) and derived == signing_key(None, "t")
    assert not derived.insecure and signing_key(None, None).insecure
