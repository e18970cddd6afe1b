"""HS256 JSON Web Tokens in the form Slurm's auth/jwt accepts (what ``scontrol token`` prints).

Slurm reads the user from the ``sun`` claim and checks ``exp`` against the
key named by ``AuthAltParameters=jwt_key=…``. The dev cluster mints tokens
with its own key; a real cluster's operator hands out tokens instead
(docs/SLURM.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def mint_hs256(key: bytes, user_name: str, *, issued_at_s: int, lifespan_s: int) -> str:
    """A token for ``user_name`` valid from ``issued_at_s`` for ``lifespan_s`` seconds."""
    if not key:
        raise ValueError("jwt: empty key")
    if lifespan_s <= 0:
        raise ValueError(f"jwt: lifespan_s must be positive, got {lifespan_s}")
    header = {"alg": "HS256", "typ": "JWT"}
    claims = {"exp": int(issued_at_s + lifespan_s), "iat": int(issued_at_s), "sun": user_name}
    signing_input = ".".join(_b64(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims))
    signature = hmac.new(key, signing_input.encode("ascii"), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


def unverified_claims(token: str) -> dict[str, Any]:
    """The claims of a token without checking its signature (to learn the ``sun`` user name)."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise ValueError("jwt: a token has three dot-separated parts")
    try:
        claims = json.loads(_unb64(parts[1]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"jwt: unreadable claims: {exc}") from exc
    if not isinstance(claims, dict):
        raise ValueError("jwt: claims are not an object")
    return claims
