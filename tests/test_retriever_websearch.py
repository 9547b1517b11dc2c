"""/search against a fake Serper on loopback replaying Serper-shaped answers: the proxy's shape,
sqlite cache, retries, no key; the agent's `web` backend end to end (agent → /search → Serper);
and the bill's guard (issue #58): queries that reach the provider are capped per minute and per
day, 429 with Retry-After past it, spend in /metrics (the agent's episode past the budget is in
tests/test_tools_auth.py, which loads the tokenizer for its episodes anyway)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import requests
from fake_serper import FakeSerper
from prom_samples import value

from agent_env.config import ConfigError, config_from_dict
from agent_env.tools import get_toolset
from retriever_server.background import RunningServer
from retriever_server.budget import BudgetExceeded, Limits, QueryBudget
from retriever_server.config import ServerConfig
from retriever_server.websearch import SerperClient

RESPONSES = json.loads((Path(__file__).parent / "fixtures" / "serper" / "responses.json").read_text())["responses"]


@pytest.fixture()
def fake():
    with FakeSerper(RESPONSES) as f:
        yield f


def client(fake: FakeSerper, tmp_path, **kw) -> SerperClient:
    return SerperClient("test-key", url=fake.url, cache_path=tmp_path / "serper.sqlite", backoff_s=0.01, **kw)


def test_search_shape_matches_retrieve_and_is_cached(fake, tmp_path):
    with RunningServer(ServerConfig(), web=client(fake, tmp_path)) as srv:
        body = {"queries": ["capital of France", "who discovered penicillin"], "topk": 3, "return_scores": True}
        first = requests.post(srv.url + "/search", json=body, timeout=30).json()
        again = requests.post(srv.url + "/search", json=body, timeout=30).json()
        plain = requests.post(srv.url + "/search", json={"queries": ["capital of France"], "topk": 3}, timeout=30)
    assert first == again and len(fake.calls) == 2  # the second request came from sqlite
    assert fake.keys == ["test-key", "test-key"]
    assert sorted(c["q"] for c in fake.calls) == ["capital of France", "who discovered penicillin"]
    assert fake.calls[0]["num"] == 3
    hits = first["result"][0]
    assert len(hits) == 3 and hits[0]["score"] > hits[1]["score"]
    top = RESPONSES["capital of France"]["organic"][0]
    assert hits[0]["document"] == {"id": top["link"], "contents": f'"{top["title"]}"\n{top["snippet"]}'}
    assert plain.json()["result"][0] == [h["document"] for h in hits]


def test_retries_429_and_5xx_then_succeeds(fake, tmp_path):
    fake.fail_with = [429, 500, 503]
    hits = client(fake, tmp_path, retries=3).search("tallest mountain on earth", 2)
    assert len(hits) == 2 and len(fake.calls) == 4
    assert hits[0]["document"]["id"] == "https://en.wikipedia.org/wiki/Mount_Everest"


def test_gives_up_with_502_after_retries(fake, tmp_path):
    fake.fail_with = [500] * 10
    with RunningServer(ServerConfig(), web=client(fake, tmp_path, retries=2)) as srv:
        r = requests.post(srv.url + "/search", json={"queries": ["down"]}, timeout=30)
        ok = requests.get(srv.url + "/health", timeout=10)
    assert r.status_code == 502 and "after 3 attempts" in r.json()["error"]
    assert len(fake.calls) == 3 and ok.status_code == 200


def test_auth_error_is_not_retried(fake, tmp_path):
    with RunningServer(ServerConfig(), web=SerperClient("wrong-key", url=fake.url,
                                                        cache_path=tmp_path / "c.sqlite")) as srv:
        r = requests.post(srv.url + "/search", json={"queries": ["x"]}, timeout=30)
    assert r.status_code == 502 and "403" in r.json()["error"] and len(fake.calls) == 1


def test_without_key_is_503_with_message(monkeypatch, tmp_path):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    with RunningServer(ServerConfig(web_cache=str(tmp_path / "c.sqlite"))) as srv:
        r = requests.post(srv.url + "/search", json={"queries": ["x"]}, timeout=10)
        bad = requests.post(srv.url + "/search", json={"queries": "x"}, timeout=10)
        dense = requests.post(srv.url + "/retrieve", json={"queries": ["x"]}, timeout=10)
    assert r.status_code == 503 and "SERPER_API_KEY" in r.json()["error"]
    assert bad.status_code == 400
    assert dense.status_code == 503 and "--index" in dense.json()["error"]


def test_env_configures_key_and_url(monkeypatch, fake, tmp_path):
    monkeypatch.setenv("SERPER_API_KEY", "test-key")
    monkeypatch.setenv("SERPER_URL", fake.url)
    c = SerperClient.from_env(cache_path=tmp_path / "c.sqlite")
    assert c.enabled and len(c.search("capital of France", 1)) == 1 and fake.keys == ["test-key"]


def _agent_searches(cfg, queries: list[str]):
    async def main():
        tools = get_toolset(cfg)
        try:
            return await asyncio.gather(*[tools.search.search(q) for q in queries])
        finally:
            await tools.close()
    return asyncio.run(main())


def test_agent_web_backend_goes_through_the_search_proxy(fake, tmp_path, monkeypatch):
    """agent (search_backend: web) → retriever_server /search → Serper: one wire format, the key
    only in the proxy's environment, concurrent agent searches coalesced into one request."""
    monkeypatch.delenv("SERPER_API_KEY", raising=False)  # the agent side holds no key
    with RunningServer(ServerConfig(), web=client(fake, tmp_path)) as srv:
        cfg = config_from_dict({"search_backend": "web", "web_search_url": srv.url + "/search", "topk": 2,
                                "batch_window_ms": 50, "retries": 0})
        france, penicillin = _agent_searches(cfg, ["capital of France", "who discovered penicillin"])
        metrics = requests.get(srv.url + "/metrics.json", timeout=10).json()
    organic = RESPONSES["capital of France"]["organic"]  # Search-R1 keeps the title line's quotes
    assert [d.title for d in france] == [f'"{o["title"]}"' for o in organic[:2]]
    assert france[0].id == organic[0]["link"] and france[0].text == organic[0]["snippet"]
    assert penicillin[0].title == '"Alexander Fleming - Wikipedia"'

    assert metrics["requests"] == {"/search": 1} and metrics["queries"] == 2  # one coalesced request
    assert fake.keys == ["test-key", "test-key"]


def test_agent_config_refuses_serper_url_and_the_removed_cache_key():
    with pytest.raises(ConfigError, match="retriever_server's /search proxy"):
        config_from_dict({"search_backend": "web", "web_search_url": "https://google.serper.dev/search"})
    with pytest.raises(ConfigError, match="'web_cache_path' was removed: the /search proxy caches"):
        config_from_dict({"web_cache_path": "~/.cache/x.sqlite"})


# ------------------------------------------------------------------- the budget (issue #58)

class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_the_budget_rolls_per_minute_and_per_day_and_a_refusal_spends_nothing():
    clock = Clock()
    budget = QueryBudget(Limits(per_minute=3, per_day=5), clock=clock)
    budget.charge(2)
    clock.t += 20
    budget.charge(1)
    with pytest.raises(BudgetExceeded) as err:
        budget.charge(1)
    assert err.value.window == "minute" and 40 <= err.value.retry_after_s <= 41  # the first 2 age out at +60 s
    assert "--max-queries-per-minute 3" in str(err.value)
    clock.t += 41
    budget.charge(2)  # the minute rolled; the day now holds 5
    clock.t += 3600
    with pytest.raises(BudgetExceeded) as err:
        budget.charge(1)
    # the first two age out 24 h after they were sent (3,661 s ago), to within the day's 60 s buckets
    assert err.value.window == "day" and 24 * 3600 - 3661 - 60 <= err.value.retry_after_s <= 24 * 3600 - 3661
    with pytest.raises(BudgetExceeded, match="more than --max-queries-per-minute 3 allows at once"):
        budget.charge(4)
    assert budget.usage() == {"minute": {"used": 0, "limit": 3, "rejected": 2},
                              "day": {"used": 5, "limit": 5, "rejected": 1}}
    clock.t += 24 * 3600
    budget.charge(3)  # a day later everything has aged out
    with pytest.raises(ValueError, match="--max-queries-per-day must be >= 1"):
        QueryBudget(Limits(per_day=0))


def _families(srv) -> str:
    return requests.get(srv.url + "/metrics", timeout=10).text


def test_search_stops_at_its_budget_with_429_and_retry_after_counting_only_provider_queries(fake, tmp_path):
    web = client(fake, tmp_path, budget=Limits(per_minute=3))
    with RunningServer(ServerConfig(), web=web) as srv:
        first = {"queries": ["capital of France", "who discovered penicillin"], "topk": 2}
        assert requests.post(srv.url + "/search", json=first, timeout=30).status_code == 200
        for _ in range(3):  # cache hits: free, however many
            assert requests.post(srv.url + "/search", json=first, timeout=30).status_code == 200
        over = requests.post(srv.url + "/search", json={"queries": ["tallest mountain on earth", "down"]}, timeout=30)
        one = requests.post(srv.url + "/search", json={"queries": ["tallest mountain on earth"]}, timeout=30)
        text = _families(srv)
        stats = requests.get(srv.url + "/metrics.json", timeout=10).json()["web_search"]
    assert over.status_code == 429 and "web-search budget spent" in over.json()["error"]
    assert 1 <= int(over.headers["Retry-After"]) <= 60
    assert one.status_code == 200  # the third query still fits; the refused request spent nothing
    assert len(fake.calls) == 3
    assert value(text, "retriever_websearch_queries_total", source="provider") == 3
    assert value(text, "retriever_websearch_queries_total", source="cache") == 6
    assert value(text, "retriever_websearch_budget_used_queries", window="minute") == 3
    assert value(text, "retriever_websearch_budget_limit_queries", window="minute") == 3
    assert value(text, "retriever_websearch_budget_limit_queries", window="day") is None  # no day limit
    assert value(text, "retriever_websearch_budget_rejected_total", window="minute") == 1
    assert value(text, "retriever_http_requests_total", route="/search", code="429") == 1
    assert stats["budget"]["minute"] == {"used": 3, "limit": 3, "rejected": 1}


def test_the_day_budget_survives_a_restart(fake, tmp_path):
    """The spend is kept in the web cache's sqlite file: a restarted proxy does not hand out a
    fresh day (docker compose restarts a crashed one)."""
    with RunningServer(ServerConfig(), web=client(fake, tmp_path, budget=Limits(per_day=2))) as srv:
        assert requests.post(srv.url + "/search", json={"queries": ["a", "b"]}, timeout=30).status_code == 200
    with RunningServer(ServerConfig(), web=client(fake, tmp_path, budget=Limits(per_day=2))) as srv:
        again = requests.post(srv.url + "/search", json={"queries": ["c"]}, timeout=30)
        cached = requests.post(srv.url + "/search", json={"queries": ["a"]}, timeout=30)
    assert again.status_code == 429 and "--max-queries-per-day 2" in again.json()["error"]
    assert int(again.headers["Retry-After"]) > 23 * 3600
    assert cached.status_code == 200 and len(fake.calls) == 2


def test_budget_flags_are_checked_at_start():
    with pytest.raises(ValueError, match="--max-queries-per-minute must be >= 1, got 0"):
        RunningServer(ServerConfig(max_queries_per_minute=0)).start()
