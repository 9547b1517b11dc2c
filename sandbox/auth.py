"""No open code runner: a shared bearer token on every route but `/health`.

Why: whoever reaches `/run_code` runs Python on the sandbox host, and on a shared cluster network
that is anyone. Started with `--auth-token-file FILE` (or `$SGRPO_TOOLS_TOKEN`), every request but
`GET /health` must carry `Authorization: Bearer <token>`, else it is answered 401 with a JSON
message and counted by reason in `/metrics`; the comparison is constant-time
(`hmac.compare_digest`) and the token never reaches a log (a SHA-256 fingerprint does, to match
both ends by eye). A bind other machines can reach without a token refuses to start (exit 2)
unless `--no-auth` declares the network trusted (SandboxFusion's client sends no token).

The retriever applies the same policy in its own module, since each service ships alone;
`tests/test_tools_auth.py` holds both to one contract.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import socket
import string
from collections.abc import Callable, Mapping
from pathlib import Path

from flask import Flask, Response, request

TOKEN_ENV = "SGRPO_TOOLS_TOKEN"
UNGUARDED = frozenset({"/health"})
TOKEN_LENGTH = (16, 4096)  # characters, inclusive
# RFC 6750 b64token characters (padding '=' only at the end, checked below)
TOKEN_ALPHABET = frozenset(string.ascii_letters + string.digits + "-._~+/")
REFUSALS = {  # reason (a bounded metrics label) -> what the client is told
    "missing": f"this sandbox requires a token: send 'Authorization: Bearer <token>' (the agent sends "
               f"${TOKEN_ENV}, the content of the sandbox's --auth-token-file)",
    "malformed": "the Authorization header is not 'Bearer <token>'",
    "wrong": f"the bearer token is not this sandbox's (compare ${TOKEN_ENV} with its --auth-token-file; "
             "the service logs the token's fingerprint at start)",
}


class AuthError(ValueError):
    """An unusable token, or a bind that needs one; never carries the token itself."""


def token_fingerprint(token: bytes) -> str:
    return hashlib.sha256(token).hexdigest()[:12]


def _validated(text: str, origin: str) -> bytes:
    token = text.strip()
    lo, hi = TOKEN_LENGTH
    if not lo <= len(token) <= hi:
        raise AuthError(f"the token from {origin} is {len(token)} characters long; use {lo} to {hi} "
                        "(e.g. openssl rand -hex 32)" if token else f"the token from {origin} is empty")
    body = token.rstrip("=")
    if not body or not set(body) <= TOKEN_ALPHABET:
        raise AuthError(f"the token from {origin} has characters a Bearer header cannot carry "
                        "(use letters, digits and -._~+/)")
    return token.encode("ascii")


def read_token(token_file: str | None, env: Mapping[str, str] = os.environ) -> bytes | None:
    """`--auth-token-file`'s content, else `$SGRPO_TOOLS_TOKEN`, else None (no token)."""
    if token_file:
        path = Path(token_file).expanduser()
        try:
            return _validated(path.read_text(encoding="ascii"), f"--auth-token-file {str(path)!r}")
        except (OSError, UnicodeDecodeError) as err:
            raise AuthError(f"--auth-token-file {str(path)!r} cannot be read: {type(err).__name__}") from None
    value = env.get(TOKEN_ENV)
    return _validated(value, f"${TOKEN_ENV}") if value else None


def loopback_only(host: str) -> bool:
    """Whether `host` names loopback addresses only (so no other machine can connect)."""
    try:
        return bool(host) and ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        addresses = {info[4][0].split("%")[0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def refuse_open_bind(host: str, token: bytes | None, no_auth: bool) -> None:
    """Raise AuthError for a reachable bind with no token and no explicit `--no-auth`."""
    if token is None and not no_auth and not loopback_only(host):
        raise AuthError(f"--host {host!r} lets other machines run code here and no token is set: give "
                        f"--auth-token-file FILE (or ${TOKEN_ENV}), or --no-auth on a network you trust "
                        "(SandboxFusion's client sends no token)")


def refusal_reason(token: bytes, header: str | None) -> str | None:
    """None when the `Authorization` header value carries `token`, else a key of REFUSALS."""
    if not header:
        return "missing"
    scheme, _, credentials = header.encode("latin-1", "replace").strip().partition(b" ")
    credentials = credentials.strip()
    if scheme.lower() != b"bearer" or not credentials:
        return "malformed"
    return None if hmac.compare_digest(credentials, token) else "wrong"


def guard(app: Flask, token: bytes | None, refused: Callable[[str], Response]) -> None:
    """Answer every request without `token` with `refused(reason)`, `/health` excepted."""
    if token is None:
        return

    @app.before_request
    def _check() -> Response | None:
        if request.path in UNGUARDED:
            return None
        reason = refusal_reason(token, request.headers.get("Authorization"))
        return None if reason is None else refused(reason)
