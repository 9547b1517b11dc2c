"""Tool clients against a real HTTP server on 127.0.0.1 (agent_env.tools, agent_env.config)."""

import asyncio
import socket

import pytest
from agent_fakes import MiniToolServer

from agent_env.config import ConfigError, config_from_dict, load_config
from agent_env.tools import HttpPolicy, JsonHttp, RetrieverClient, SandboxClient, ToolError

CORPUS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "1", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    {"id": "wiki-7", "contents": '"Rome"\nRome is the capital of Italy.'},
]

FAST = HttpPolicy(timeout_s=5, retries=1, backoff_s=0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(coro_fn):
    """Run `coro_fn(http)` on a fresh loop and close the pooled session afterwards."""
    async def main():
        http = JsonHttp(FAST)
        try:
            return await coro_fn(http)
        finally:
            await http.close()
    return asyncio.run(main())


def test_retriever_returns_docs_with_titles():
    with MiniToolServer(CORPUS) as srv:
        docs = run(lambda http: RetrieverClient(srv.url("/retrieve"), http, topk=2).search("capital of Germany"))
    assert [d.id for d in docs][0] == "1"
    assert docs[0].title == '"Berlin"' and docs[0].text == "Berlin is the capital of Germany."  # Search-R1 keeps quotes
    assert len(docs) == 2


def test_concurrent_searches_are_coalesced_into_batches():
    with MiniToolServer(CORPUS) as srv:
        async def go(http):
            client = RetrieverClient(srv.url("/retrieve"), http, topk=1, window_s=0.02, max_batch=16)
            results = await asyncio.gather(*[client.search(f"capital {i}") for i in range(64)])
            return client, results
        client, results = run(go)
        assert len(results) == 64 and all(len(r) == 1 for r in results)
        assert srv.queries_seen == 64
        assert srv.requests["/retrieve"] == client.batches_sent <= 8  # 64 searches, max_batch 16


def test_dead_retriever_raises_tool_error():
    url = f"http://127.0.0.1:{free_port()}/retrieve"
    with pytest.raises(ToolError, match="attempts"):
        run(lambda http: RetrieverClient(url, http).search("x"))


def test_sandbox_runs_code_and_reports_timeouts():
    with MiniToolServer() as srv:
        async def go(http):
            client = SandboxClient(srv.url("/run_code"), http, run_timeout_s=1.0)
            ok = await client.run("print(6 * 7)")
            err = await client.run("import sys; print('oops', file=sys.stderr); sys.exit(3)")
            slow = await client.run("import time; time.sleep(5)")
            return ok, err, slow
        ok, err, slow = run(go)
    assert ok == "42\n"
    assert "oops" in err
    assert "TimeLimitExceeded" in slow


def test_slow_sandbox_http_timeout_is_a_tool_error():
    with MiniToolServer() as srv:
        srv.delay_s["/run_code"] = 2.0
        with pytest.raises(ToolError, match="timed out"):
            run(lambda http: SandboxClient(srv.url("/run_code"), http, run_timeout_s=0.2, http_margin_s=0.2)
                .run("print(1)"))


def test_config_rejects_unknown_keys_and_bad_values(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"unknown agent config keys \['max_turn', 'topK'\]"):
        config_from_dict({"max_turn": 3, "topK": 2})
    with pytest.raises(ConfigError, match="reward='bleu'"):
        config_from_dict({"reward": "bleu"})
    path = tmp_path / "agent.yaml"
    path.write_text("max_turns: 2\ntemplate: deep_research\nreward: f1\n")
    monkeypatch.setenv("SGRPO_AGENT_CONFIG", str(path))
    cfg = load_config()
    assert (cfg.max_turns, cfg.template, cfg.reward, cfg.topk) == (2, "deep_research", "f1", 3)
    assert cfg.allowed_actions == ("search", "code", "answer")
    monkeypatch.setenv("SGRPO_AGENT_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config()
