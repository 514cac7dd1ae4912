"""Signatures on registry records, so a service applies only what a control service holding
the same key wrote.

The registry topic lives on a broker that other clients may write to (a shared cluster, a
pipeline whose sink was pointed at it). A record is signed with an HMAC-SHA256 carried in a
record header; a record without a valid one is skipped. The MAC covers the record key as
well as the value (a tombstone covers its key alone), so a signed value cannot be replayed
under another pipeline's key, and a forged tombstone cannot delete a pipeline.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

HEADER = "tidemark-signature"

# --insecure-dev without a token: services on one machine still share a registry; the
# signature then only tells our records from a sink's, not from an attacker's
DEV_KEY = b"tidemark-insecure-dev-registry-key"


@dataclass(frozen=True)
class SigningKey:
    secret: bytes
    source: str  # where the key came from, for the start-up log

    @property
    def insecure(self) -> bool:
        return self.secret == DEV_KEY


def signing_key(registry_key: str | None, api_token: str | None) -> SigningKey:
    """``TIDEMARK_REGISTRY_KEY`` if set, else derived from the API token (services sharing a
    token share a registry without more configuration), else the fixed dev key. Derived,
    not the token itself, so the token never serves as a MAC key directly."""
    if registry_key:
        return SigningKey(registry_key.encode(), "TIDEMARK_REGISTRY_KEY")
    if api_token:
        derived = hmac.new(api_token.encode(), b"tidemark registry signing key", hashlib.sha256).digest()
        return SigningKey(derived, "derived from TIDEMARK_API_TOKEN")
    return SigningKey(DEV_KEY, "the fixed insecure-dev key")


def sign(key: SigningKey, record_key: bytes, value: bytes | None) -> bytes:
    mac = hmac.new(key.secret, len(record_key).to_bytes(4, "big") + record_key, hashlib.sha256)
    mac.update(b"\x00" if value is None else b"\x01" + value)
    return mac.hexdigest().encode()


def headers(key: SigningKey, record_key: bytes, value: bytes | None) -> list[tuple[str, bytes]]:
    return [(HEADER, sign(key, record_key, value))]


def verified(key: SigningKey, record_key: bytes, value: bytes | None,
             record_headers: Sequence[tuple[str, bytes | None]] | None) -> bool:
    """True when the record carries exactly one signature header and it is valid."""
    given = [v for k, v in record_headers or () if k == HEADER]
    return len(given) == 1 and given[0] is not None and hmac.compare_digest(given[0], sign(key, record_key, value))
