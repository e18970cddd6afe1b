from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest

from executors.slurm.jwt import mint_hs256, unverified_claims


def _b64decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def test_token_shape_claims_and_signature() -> None:
    key = b"0123456789abcdef0123456789abcdef"
    token = mint_hs256(key, "root", issued_at_s=1_700_000_000, lifespan_s=600)
    header_b64, claims_b64, sig_b64 = token.split(".")
    assert "=" not in token
    assert json.loads(_b64decode(header_b64)) == {"alg": "HS256", "typ": "JWT"}
    assert unverified_claims(token) == {"exp": 1_700_000_600, "iat": 1_700_000_000, "sun": "root"}
    expected = hmac.new(key, f"{header_b64}.{claims_b64}".encode(), hashlib.sha256).digest()
    assert _b64decode(sig_b64) == expected


def test_known_vector() -> None:
    # Same header/claims layout as `scontrol token` prints (compact JSON, keys exp, iat, sun).
    token = mint_hs256(b"secret", "alice", issued_at_s=1_000, lifespan_s=60)
    assert token.split(".")[:2] == ["eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9",
                                    "eyJleHAiOjEwNjAsImlhdCI6MTAwMCwic3VuIjoiYWxpY2UifQ"]


@pytest.mark.parametrize("bad", ["", "a.b", "a.!!!.c", "a." + base64.urlsafe_b64encode(b"[1]").decode() + ".c"])
def test_unverified_claims_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        unverified_claims(bad)


def test_mint_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        mint_hs256(b"", "root", issued_at_s=0, lifespan_s=1)
    with pytest.raises(ValueError):
        mint_hs256(b"k", "root", issued_at_s=0, lifespan_s=0)
