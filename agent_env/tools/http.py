"""Pooled async JSON-over-HTTP with timeouts and retries, shared by every tool client.

One aiohttp session per event loop (sessions cannot cross loops); 429 and 5xx answers and
connection failures are retried with exponential backoff; timeouts are not (a slow tool
would only be slow again), nor is a 429 whose ``Retry-After`` is longer than
``MAX_RETRY_AFTER_S`` (the web-search budget saying "in 40 s" or "tomorrow": waiting would stall
every rollout of the step). Every final failure is a ToolError, which the episode turns into
an observation, so a refused call never ends the run.

The tool services' shared token ($SGRPO_TOOLS_TOKEN, see ``agent_env.tools``) goes in every
request as ``Authorization: Bearer``; a 401 is a ToolError saying which token to set.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import aiohttp


class ToolError(RuntimeError):
    """A tool call failed for good; `str(err)` is shown to the policy as the observation."""


RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
# A 429 asking for a longer wait than this is not retried (the sandbox's busy 429 says 1 s).
MAX_RETRY_AFTER_S = 5.0
TOKEN_ENV = "SGRPO_TOOLS_TOKEN"


def _retry_after_s(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _refused(url: str, body: str, token_sent: bool) -> ToolError:
    why = (f"it refused the token in ${TOKEN_ENV} (it is not the content of the service's --auth-token-file)"
           if token_sent else f"it requires a token: set ${TOKEN_ENV} to the content of its --auth-token-file")
    return ToolError(f"HTTP 401 from {url}: {why} ({body[:200]})")


@dataclass(frozen=True)
class HttpPolicy:
    timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 0.5
    max_connections: int = 64

    def backoff_total_s(self) -> float:
        """Seconds slept between attempts when every attempt fails fast (connection refused)."""
        return sum(self.backoff_s * 2 ** i for i in range(self.retries))

    def worst_case_s(self, timeout_s: float | None = None) -> float:
        """The longest one call can take before it answers or raises ToolError: every attempt
        cut at the timeout, plus the backoffs. Why it is finite: each attempt has a total
        timeout (a peer that accepts and never answers included) and the attempts are counted;
        a time-out ends the call at once (it is not retried), so the usual bound of a hang is
        one timeout, and of a dead service `backoff_total_s`."""
        return (self.retries + 1) * (timeout_s or self.timeout_s) + self.backoff_total_s()


class JsonHttp:
    """POST JSON, get JSON; lazily (re)creates its session on the running loop. ``token``: sent as
    ``Authorization: Bearer`` with every request (None: no header, for services without one)."""

    def __init__(self, policy: HttpPolicy = HttpPolicy(), token: str | None = None):
        self.policy = policy
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.requests_sent = 0

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            connector = aiohttp.TCPConnector(limit=self.policy.max_connections)
            self._session = aiohttp.ClientSession(connector=connector)
            self._loop = loop
        return self._session

    async def post(self, url: str, payload: dict, headers: dict | None = None,
                   timeout_s: float | None = None) -> dict:
        session = self._get_session()
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.policy.timeout_s)
        headers = {**self._auth, **(headers or {})}
        last = "no attempt"
        for attempt in range(self.policy.retries + 1):
            if attempt:
                await asyncio.sleep(self.policy.backoff_s * 2 ** (attempt - 1))
            self.requests_sent += 1
            try:
                async with session.post(url, json=payload, headers=headers, timeout=timeout) as resp:
                    body = await resp.text()
                    wait = _retry_after_s(resp.headers.get("Retry-After")) if resp.status == 429 else None
                    if wait is not None and wait > MAX_RETRY_AFTER_S:
                        raise ToolError(f"HTTP 429: {body[:200]} (Retry-After {wait:g} s: not retried)")
                    if resp.status in RETRY_STATUS:
                        last = f"HTTP {resp.status}: {body[:200]}"
                        continue
                    if resp.status == 401:
                        raise _refused(url, body, bool(self._auth))
                    if resp.status >= 400:
                        raise ToolError(f"HTTP {resp.status}: {body[:200]}")
                    try:
                        return json.loads(body)
                    except json.JSONDecodeError as err:
                        raise ToolError(f"invalid JSON from {url}: {err}") from err
            except asyncio.TimeoutError as err:
                raise ToolError(f"timed out after {timeout.total:g} s") from err
            except aiohttp.ClientError as err:
                last = f"{type(err).__name__}: {err}"
        raise ToolError(f"{last} (after {self.policy.retries + 1} attempts)")

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
