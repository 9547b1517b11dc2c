"""The agent's own rules for a failed tool call and for the per-trajectory time cap, through
OpenRLHF's real MultiTurnAgentExecutor (our AgentExecutor) with a scripted engine (real tokenizer):

- a failed call is a call: it counts in ``tool_calls`` and its tool's ``*_calls`` (so in the
  stratum), and in ``tool_errors`` and its tool's ``*_errors``;
- a body outside the agreed schema, 200 or not, is a named failure, never passages or output;
- ``episode_timeout_s`` (off by default): a tool call in flight at the cap is cut there, a turn
  generated past it runs no tool, and the episode ends with what it has, ``capped`` = 1; a sibling
  trajectory in the same batch is untouched.
The tools are real loopback servers: a silent one (``tests/fault_tools.FaultProxy`` in
``silent`` mode) and MiniToolServer (``tests/agent_fakes.py``).
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import torch
from agent_fakes import MiniToolServer, ScriptedEngine
from fault_tools import FaultProxy

from agent_env import info_keys as K
from agent_env.config import AgentConfig, ConfigError, config_from_dict
from agent_env.openrlhf_agent import AgentExecutor
from agent_env.tools import ToolError, get_toolset
from agent_env.tools.retriever import parse_retrieve_response
from agent_env.tools.sandbox import format_run_result
from openrlhf_sgrpo import assets
from openrlhf_sgrpo.engine.sampling import CompletionOutput, RequestOutput, SamplingParams
from openrlhf_sgrpo.strata import strata_from_info

SLACK_S = 2.0  # scheduling on a loaded 2-core box, on top of each configured bound
CORPUS = [{"id": "0", "contents": '"Paris"\nParis is the capital and largest city of France.'}]
SEARCH = "<think>look it up</think>\n<search> capital of France </search>"
ANSWER = "<answer> Paris </answer>"


@pytest.fixture(scope="module")
def tok():
    return assets.load_qwen2_tokenizer()


class SlowScriptedEngine(ScriptedEngine):
    """Scripted turns, the k-th one returned after ``delays[k]`` seconds (a slow generation)."""

    def __init__(self, tokenizer, script, delays):
        super().__init__(tokenizer, script, RequestOutput, CompletionOutput)
        self.delays = list(delays)

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        if self.delays:
            await asyncio.sleep(self.delays.pop(0))
        return await super().generate(prompt_token_ids, sampling_params, multi_modal_data)


def run(cfg: AgentConfig, tok, engines, label='["Paris"]'):
    """Every engine's trajectory at once; (results, seconds each took)."""
    async def main():
        ex = AgentExecutor(cfg)

        async def one(engine):
            start = time.monotonic()
            out = await ex.execute("capital?", label, SamplingParams(max_tokens=None), 2048, tok, engine)
            return out, time.monotonic() - start
        try:
            return await asyncio.gather(*(one(e) for e in engines))
        finally:
            await get_toolset(cfg).close()
    pairs = asyncio.run(main())
    return [p[0] for p in pairs], [p[1] for p in pairs]


def scripted(tok, script):
    return ScriptedEngine(tok, script, RequestOutput, CompletionOutput)


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on: connection refused
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/retrieve"


def test_a_failed_call_is_a_call_in_counters_and_strata(tok):
    with MiniToolServer(CORPUS) as srv:
        ok_cfg = config_from_dict({"retriever_url": srv.url("/retrieve"), "retries": 0})
        (ok,), _ = run(ok_cfg, tok, [scripted(tok, [SEARCH, ANSWER])])
    dead_cfg = config_from_dict({"retriever_url": _dead_url(), "retries": 1, "backoff_s": 0.01})
    (failed, none), _ = run(dead_cfg, tok, [scripted(tok, [SEARCH, ANSWER]), scripted(tok, [ANSWER])])
    f = failed["extra_logs"]
    assert (f[K.TOOL_CALLS], f[K.SEARCH_CALLS], f[K.TOOL_ERRORS], f[K.SEARCH_ERRORS], f[K.CODE_ERRORS]) == (1, 1, 1, 1, 0)
    assert "<information>search failed:" in tok.decode(failed["observation_tokens"])
    assert ok["extra_logs"][K.TOOL_ERRORS] == 0 and ok["extra_logs"][K.SEARCH_CALLS] == 1
    # one prompt group: the failed search and the working one share a stratum; no call is another
    rows = [ok["extra_logs"], f, none["extra_logs"]]
    strata = strata_from_info({K.TOOL_CALLS: torch.tensor([r[K.TOOL_CALLS] for r in rows])}).tolist()
    assert strata[0] == strata[1] != strata[2]


@pytest.mark.parametrize("body, message", [
    ({"result": [[{"title": "no contents"}]]}, "a hit has no 'contents' string"),
    ({"result": [[{"document": "just text"}]]}, "a hit has no 'contents' string"),
    ({"result": ["not a list"]}, "a query's hits are str"),
    ({"result": [[], []]}, "'result' is list of 2 lists for 1 queries"),
    ({"detail": "Not Found"}, "'result' is NoneType for 1 queries"),
])
def test_a_retrieve_body_outside_the_schema_is_a_named_failure(body, message):
    with pytest.raises(ToolError, match="not the /retrieve schema") as err:
        parse_retrieve_response(body, 1)
    assert message in str(err.value)


@pytest.mark.parametrize("body", [{"detail": "Not Found"}, {"status": "ok", "run_result": {"stdout": "1"}},
                                  {"status": "Success", "run_result": "1\n"}])
def test_a_run_code_body_outside_the_schema_is_a_named_failure(body):
    with pytest.raises(ToolError, match="not the /run_code schema"):
        format_run_result(body)


def test_the_cap_is_off_by_default_and_checked():
    assert AgentConfig().episode_timeout_s is None
    for bad in (0, -1.0):
        with pytest.raises(ConfigError, match="episode_timeout_s must be > 0 or null"):
            config_from_dict({"episode_timeout_s": bad})


def test_the_cap_cuts_a_hanging_call_and_ends_the_episode_with_what_it_has(tok):
    cap = 1.0
    with FaultProxy("http://127.0.0.1:9") as silent:
        silent.mode = "silent"  # takes the request, never answers: only the cap ends the wait
        cfg = config_from_dict({"retriever_url": silent.url + "/retrieve", "request_timeout_s": 60, "retries": 0,
                                "episode_timeout_s": cap})
        hung = scripted(tok, [SEARCH, ANSWER])
        (capped, sibling), seconds = run(cfg, tok, [hung, scripted(tok, [ANSWER])])
    c = capped["extra_logs"]
    assert cap - 0.05 <= seconds[0] <= cap + SLACK_S < cfg.request_timeout_s
    assert (c[K.CAPPED], c[K.TURNS], c[K.TOOL_CALLS], c[K.TOOL_ERRORS], c[K.SEARCH_ERRORS], c[K.ANSWERED]) == \
        (1, 1, 1, 1, 1, 0)
    assert capped["reward"] == 0.0 and hung.script == [ANSWER]  # no turn after the cap
    assert "search cut: the episode reached its time cap (episode_timeout_s=1)" in tok.decode(capped["observation_tokens"])
    assert sibling["extra_logs"][K.CAPPED] == 0 and sibling["reward"] == 1.0


def test_a_turn_generated_past_the_cap_runs_no_tool_but_an_answer_counts(tok):
    cap = 0.3
    with MiniToolServer(CORPUS) as srv:
        cfg = config_from_dict({"retriever_url": srv.url("/retrieve"), "episode_timeout_s": cap})
        late_search = SlowScriptedEngine(tok, ["thinking...", SEARCH, ANSWER], [0.0, cap + 0.2])
        late_answer = SlowScriptedEngine(tok, ["thinking...", ANSWER], [0.0, cap + 0.2])
        (searched, answered), _ = run(cfg, tok, [late_search, late_answer])
    s, a = searched["extra_logs"], answered["extra_logs"]
    assert (s[K.CAPPED], s[K.TOOL_CALLS], s[K.TURNS], s[K.INVALID_ACTIONS]) == (1, 0, 2, 1)
    assert late_search.script == [ANSWER] and searched["reward"] == 0.0
    assert (a[K.CAPPED], a[K.ANSWERED], answered["reward"]) == (0, 1, 1.0)  # it finished: not capped
