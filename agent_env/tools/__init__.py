"""Async tool clients (retriever, sandbox) and the per-process ToolSet.

OpenRLHF builds a fresh AgentInstance per trajectory, so clients are shared through
`get_toolset(config)`: one connection pool and one retriever batcher per process. The `web`
search backend is the same `/retrieve`-format client pointed at retriever_server's `/search`
proxy, which owns the Serper key and cache (why: retriever_server/websearch.py).

The services' shared token comes from $SGRPO_TOOLS_TOKEN in this process's environment, never
from a file: on a cluster the CLI forwards the variable to every Ray worker in the runtime env it
gives them (as it does the agent config's content), so no node needs the head's disk.
"""

from __future__ import annotations

import os

from agent_env.config import AgentConfig
from agent_env.tools.http import TOKEN_ENV, HttpPolicy, JsonHttp, ToolError
from agent_env.tools.retriever import RetrieverClient
from agent_env.tools.sandbox import SandboxClient

__all__ = [
    "TOKEN_ENV",
    "HttpPolicy",
    "JsonHttp",
    "RetrieverClient",
    "SandboxClient",
    "ToolError",
    "ToolSet",
    "get_toolset",
]


class ToolSet:
    """The search client chosen by `search_backend` plus the sandbox client."""

    def __init__(self, cfg: AgentConfig, token: str | None = None):
        policy = HttpPolicy(timeout_s=cfg.request_timeout_s, retries=cfg.retries, backoff_s=cfg.backoff_s,
                            max_connections=cfg.max_connections)
        self.http = JsonHttp(policy, token=token)
        url = cfg.web_search_url if cfg.search_backend == "web" else cfg.retriever_url
        self.search = RetrieverClient(url, self.http, topk=cfg.topk, window_s=cfg.batch_window_ms / 1000.0,
                                      max_batch=cfg.max_batch)
        self.sandbox = SandboxClient(cfg.sandbox_url, self.http, run_timeout_s=cfg.code_timeout_s)

    async def close(self) -> None:
        await self.http.close()


_TOOLSETS: dict[tuple[AgentConfig, str | None], ToolSet] = {}


def tools_token() -> str | None:
    """The services' token from $SGRPO_TOOLS_TOKEN (surrounding whitespace dropped), or None."""
    return os.environ.get(TOKEN_ENV, "").strip() or None


def get_toolset(cfg: AgentConfig) -> ToolSet:
    """The process-wide ToolSet for this config and token (configs are frozen, hence hashable)."""
    key = (cfg, tools_token())
    if key not in _TOOLSETS:
        _TOOLSETS[key] = ToolSet(cfg, token=key[1])
    return _TOOLSETS[key]
