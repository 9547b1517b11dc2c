"""Who may call the retriever: one shared bearer token on every route but ``/health``.

Why: on a shared cluster network whoever reaches the port could otherwise spend the operator's
web-search credits through ``/search`` and load the index host. Started with
``--auth-token-file FILE`` (or ``$SGRPO_TOOLS_TOKEN``), every request except ``GET /health``
(orchestrators' health checks) must carry ``Authorization: Bearer <token>``; anything else is a
401 with a JSON message, counted in the metrics by reason. The token is compared in constant time
(``hmac.compare_digest``) and never logged: the log shows a short SHA-256 fingerprint, so the
operator can check that two ends hold the same token without seeing it.

Secure by default: a bind to anything but loopback without a token refuses to start, naming
``--auth-token-file`` and ``--no-auth`` (a trusted network; Search-R1's own client sends no
header). Loopback needs nothing, so single-machine runs and tests stay as they were.

The package ships alone, so the sandbox enforces the same policy with its own module
(``sandbox/auth.py``); both are held to one contract by ``tests/test_tools_auth.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

TOKEN_ENV = "SGRPO_TOOLS_TOKEN"
OPEN_PATHS = frozenset({"/health"})
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 4096
# RFC 6750's b64token: what may follow "Bearer " in a header without quoting
_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
REASONS = ("missing", "malformed", "wrong")  # bounded: the metrics' label values
MESSAGES = {
    "missing": f"this service requires a token: send 'Authorization: Bearer <token>' (the agent sends "
               f"${TOKEN_ENV}; the token is the content of the service's --auth-token-file)",
    "malformed": "the Authorization header is not 'Bearer <token>'",
    "wrong": f"the bearer token is not this service's (check ${TOKEN_ENV} against the service's "
             "--auth-token-file; the service logs the token's fingerprint at start)",
}


class AuthConfigError(ValueError):
    """A token that cannot be used, or a bind that needs one; the message never holds the token."""


def fingerprint(token: bytes) -> str:
    """A short, non-reversible name for a token, safe to log and compare by eye."""
    return hashlib.sha256(token).hexdigest()[:12]


def parse_token(text: str, source: str) -> bytes:
    """The token in ``text`` (surrounding whitespace dropped); errors name ``source`` only."""
    token = text.strip()
    if not token:
        raise AuthConfigError(f"the token from {source} is empty")
    if len(token) < MIN_TOKEN_CHARS or len(token) > MAX_TOKEN_CHARS:
        raise AuthConfigError(f"the token from {source} is {len(token)} characters long; use "
                              f"{MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS} (e.g. openssl rand -hex 32)")
    if not _B64TOKEN.fullmatch(token):
        raise AuthConfigError(f"the token from {source} has characters a Bearer header cannot carry "
                              "(use letters, digits and -._~+/, e.g. openssl rand -hex 32)")
    return token.encode("ascii")


def load_token(token_file: str | None, env: Mapping[str, str] = os.environ) -> tuple[bytes | None, str]:
    """(token, where it came from): ``--auth-token-file`` first, then ``$SGRPO_TOOLS_TOKEN``."""
    if token_file:
        path = Path(token_file).expanduser()
        try:
            text = path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as e:
            raise AuthConfigError(f"--auth-token-file {str(path)!r} cannot be read: {type(e).__name__}") from None
        return parse_token(text, f"--auth-token-file {str(path)!r}"), f"--auth-token-file {path}"
    if env.get(TOKEN_ENV):
        return parse_token(env[TOKEN_ENV], f"${TOKEN_ENV}"), f"${TOKEN_ENV}"
    return None, "none"


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback one (an empty host is every interface)."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def check_bind(host: str, token: bytes | None, no_auth: bool) -> None:
    """Refuse a bind other machines can reach when nobody asked who the callers are."""
    if token is None and not no_auth and not is_loopback(host):
        raise AuthConfigError(
            f"--host {host!r} is reachable from other machines and no token is set: give "
            f"--auth-token-file FILE (or ${TOKEN_ENV}) so every caller must send it, or --no-auth "
            "on a network you trust (Search-R1's own client sends no token)")


@dataclass(frozen=True)
class BearerAuth:
    """Checks an ``Authorization`` header against the token; ``refusal`` says why it fails."""

    token: bytes = field(repr=False)

    def refusal(self, header: str | None) -> str | None:
        """None when ``header`` carries the token, else one of ``REASONS``."""
        if not header:
            return "missing"
        raw = header.encode("latin-1", "replace")  # WSGI headers are latin-1 text: bytes again
        scheme, _, credentials = raw.strip().partition(b" ")
        if scheme.lower() != b"bearer" or not credentials.strip():
            return "malformed"
        return None if hmac.compare_digest(credentials.strip(), self.token) else "wrong"


def install(app, auth: BearerAuth | None, on_refused: Callable[[str], None]) -> None:
    """Make ``app`` (Flask) answer 401 to every request without the token, ``/health`` excepted."""
    if auth is None:
        return
    from flask import jsonify, request

    @app.before_request
    def _require_token():
        if request.path in OPEN_PATHS:
            return None
        reason = auth.refusal(request.headers.get("Authorization"))
        if reason is None:
            return None
        on_refused(reason)
        resp = jsonify({"error": MESSAGES[reason]})
        resp.status_code = 401
        resp.headers["WWW-Authenticate"] = 'Bearer realm="retriever_server"'
        return resp
