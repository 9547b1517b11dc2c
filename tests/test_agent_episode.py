"""Episodes through OpenRLHF's real MultiTurnAgentExecutor (our AgentExecutor subclass), with a
scripted engine that emits fixed action texts through the real Qwen2 tokenizer and tools served
by a real loopback HTTP server."""

import asyncio
import socket

import pytest
from agent_fakes import MiniToolServer, ScriptedEngine
from peer_rules import search_r1_search_observation

from agent_env import info_keys as K
from agent_env import metadata as M
from agent_env.config import config_from_dict
from agent_env.openrlhf_agent import AgentExecutor
from agent_env.tools import get_toolset
from openrlhf_sgrpo import assets
from openrlhf_sgrpo.engine.sampling import CompletionOutput, RequestOutput, SamplingParams

CORPUS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "1", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    {"id": "wiki-7", "contents": '"Rome"\nRome is the capital of Italy. ' + "It is old. " * 200},
]
SEARCH = "<think>I should look it up.</think>\n<search> capital of France </search>"
ANSWER = "<think>The documents say Paris.</think>\n<answer> Paris </answer>"


@pytest.fixture(scope="module")
def tok():
    return assets.load_qwen2_tokenizer()


@pytest.fixture()
def server():
    with MiniToolServer(CORPUS) as srv:
        yield srv


def make_cfg(srv, **overrides):
    base = dict(retriever_url=srv.url("/retrieve"), sandbox_url=srv.url("/run_code"),
                web_search_url=srv.url("/search"), retries=1, backoff_s=0.01, request_timeout_s=5)
    return config_from_dict({**base, **overrides})


def run_episodes(cfg, tok, scripts, label='["Paris", "paris city"]', max_length=2048, question="capital?"):
    async def main():
        executor = AgentExecutor(cfg)
        try:
            return await asyncio.gather(*[
                executor.execute(question, label, SamplingParams(temperature=1.0, max_tokens=None, logprobs=None),
                                 max_length, tok, ScriptedEngine(tok, s, RequestOutput, CompletionOutput))
                for s in scripts])
        finally:
            await get_toolset(cfg).close()
    return asyncio.run(main())


def test_search_then_answer(server, tok):
    cfg = make_cfg(server, max_obs_tokens=2000)  # no cut: the observation is compared whole
    (res,) = run_episodes(cfg, tok, [[SEARCH, ANSWER]])
    meta, ranges, tokens = res["extra_logs"], res["action_ranges"], res["observation_tokens"]
    assert res["reward"] == 1.0 and res["scores"] == 1.0
    assert set(meta) == set(K.metadata_keys(cfg.max_turns, cfg.topk))
    assert all(isinstance(v, (int, float)) for v in meta.values())
    assert (meta[K.TURNS], meta[K.SEARCH_CALLS], meta[K.TOOL_CALLS], meta[K.ANSWERED]) == (2, 1, 1, 1)
    assert (meta[K.FIRST_TOOL_TURN], meta[K.EM], meta[K.F1], meta[K.INVALID_ACTIONS]) == (0, 1.0, 1.0, 0)
    # action tokens are exactly the scripted texts; everything between them is prompt/observation
    assert [tok.decode(tokens[s:e]) for s, e in ranges] == [SEARCH, ANSWER]
    text = tok.decode(tokens)
    assert text.startswith("Answer the given question.") and "Question: capital?\n" in text
    obs = tok.decode(tokens[ranges[0][1]:ranges[1][0]])
    turns = M.decode_turns(meta)
    # the whole observation, byte for byte, is what Search-R1 shows for the same three passages
    by_id = {M.encode_doc_id(d["id"]): d["contents"] for d in CORPUS}
    assert obs == search_r1_search_observation([by_id[i] for i in turns[0].doc_ids])
    assert obs.startswith('\n\n<information>Doc 1(Title: "Paris") Paris is the capital and largest city')
    assert [t.kind for t in turns] == ["search", "answer"]
    assert [(t.start, t.end) for t in turns] == ranges
    assert turns[0].doc_ids[0] == 0 and len(turns[0].doc_ids) == 3 and turns[1].doc_ids == []
    assert meta[K.ACTION_TOKENS] == sum(e - s for s, e in ranges) < len(tokens) - ranges[0][0]


def test_max_turns_then_final_turn_without_tools(server, tok):
    cfg = make_cfg(server, max_turns=2)
    (res,) = run_episodes(cfg, tok, [[SEARCH] * 5])
    meta = res["extra_logs"]
    assert meta[K.TURNS] == 3 == len(res["action_ranges"])  # 2 tool turns + the final one
    assert (meta[K.SEARCH_CALLS], meta[K.ANSWERED], res["reward"]) == (2, 0, 0.0)
    assert [t.kind for t in M.decode_turns(meta)] == ["search", "search", "search"]
    assert server.queries_seen == 2  # the final turn's search never ran


def test_invalid_actions_get_corrective_observation(server, tok):
    cfg = make_cfg(server)
    (res,) = run_episodes(cfg, tok, [["<search></search>", "I think Paris.", ANSWER]])
    meta = res["extra_logs"]
    assert (meta[K.INVALID_ACTIONS], meta[K.TOOL_CALLS], meta[K.FIRST_TOOL_TURN]) == (2, 0, -1)
    text = tok.decode(res["observation_tokens"])
    assert text.count("My previous action is invalid.") == 2
    assert [meta[K.turn_kind_key(k)] for k in range(4)] == [K.KIND_INVALID, K.KIND_NONE, K.KIND_ANSWER, -1]


def test_code_turn_in_deep_research(server, tok):
    cfg = make_cfg(server, template="deep_research", reward="gaia")
    code = "<think>compute</think><code>\n```python\nprint(6 * 7)\n```\n</code>"
    (res,) = run_episodes(cfg, tok, [[code, "<think>ok</think><answer>42</answer>"]], label="42.0")
    meta = res["extra_logs"]
    assert (meta[K.CODE_CALLS], meta[K.TOOL_ERRORS], res["reward"]) == (1, 0, 1.0)
    assert "\n\n<result>42\n</result>\n\n" in tok.decode(res["observation_tokens"])


def test_observations_are_cut_to_max_obs_tokens(server, tok):
    cfg = make_cfg(server, max_obs_tokens=20, topk=1)
    (res,) = run_episodes(cfg, tok, [["<search>Rome Italy old</search>", ANSWER]])
    s, e = res["action_ranges"][0][1], res["action_ranges"][1][0]
    obs = tok.decode(res["observation_tokens"][s:e])
    inner = obs[len("\n\n<information>"):-len("</information>\n\n")]
    assert obs.startswith('\n\n<information>Doc 1(Title: "Rome") Rome is the capital')
    assert len(tok(inner, add_special_tokens=False)["input_ids"]) <= 20


def test_failing_tools_become_observations(tok):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/retrieve"
    with MiniToolServer(CORPUS) as srv:
        srv.delay_s["/run_code"] = 2.0
        srv.fail_status["/search"] = 500
        dead_cfg = make_cfg(srv, retriever_url=dead)
        (r1,) = run_episodes(dead_cfg, tok, [[SEARCH, ANSWER]])
        slow_cfg = make_cfg(srv, template="deep_research", code_timeout_s=0.1, request_timeout_s=0.1)
        # the SandboxClient adds its HTTP margin to code_timeout_s: force a short one for this test
        get_toolset(slow_cfg).sandbox.http_margin_s = 0.2
        (r2,) = run_episodes(slow_cfg, tok, [["<code>print(1)</code>", ANSWER]])
        web_cfg = make_cfg(srv, search_backend="web")
        (r3,) = run_episodes(web_cfg, tok, [[SEARCH, ANSWER]])
    for res, needle in ((r1, "<information>search failed: "), (r2, "<result>code execution failed: timed out"),
                        (r3, "<information>search failed: ")):
        assert needle in tok.decode(res["observation_tokens"])
        assert res["extra_logs"][K.TOOL_ERRORS] == 1 and res["extra_logs"][K.TOOL_CALLS] == 1
        assert res["reward"] == 1.0  # the rollout went on and answered


def test_concurrent_trajectories_share_retrieve_requests(server, tok):
    cfg = make_cfg(server, batch_window_ms=20)
    results = run_episodes(cfg, tok, [[f"<search>capital {i}</search>", ANSWER] for i in range(64)])
    assert all(r["extra_logs"][K.SEARCH_CALLS] == 1 for r in results)
    assert server.queries_seen == 64
    assert server.requests["/retrieve"] < 64
    keys = {frozenset(r["extra_logs"]) for r in results}
    assert len(keys) == 1


def test_format_reward_and_budget_exhaustion_keep_all_keys(server, tok):
    cfg = make_cfg(server, format_reward=True, structure_format_score=0.2)
    (good,) = run_episodes(cfg, tok, [[SEARCH, ANSWER]])
    assert good["reward"] == 1.0
    (bare,) = run_episodes(cfg, tok, [["<answer>Paris</answer>"]])
    assert bare["reward"] == pytest.approx(0.8) and bare["scores"] == 1.0
    # a tiny context: the prompt alone exhausts the budget after one truncated turn
    (short,) = run_episodes(cfg, tok, [["<think>hm</think><search>" + "capital " * 300]], max_length=150)
    assert short["truncated"] and set(short["extra_logs"]) == set(good["extra_logs"])
    assert short["extra_logs"][K.INVALID_ACTIONS] == 1


def test_an_answer_inside_an_unclosed_think_is_no_answer_for_reward_em_and_metadata(server, tok):
    """One extraction rule: the final turn's `<answer>` inside `<think>` counts nowhere (it used to
    earn 0.8 of format reward while EM and `answered` said there was no answer)."""
    cfg = make_cfg(server, format_reward=True, max_turns=1)
    (res,) = run_episodes(cfg, tok, [[SEARCH, "<think>maybe <answer> Paris </answer>"]])
    meta = res["extra_logs"]
    assert (meta[K.ANSWERED], meta[K.EM], meta[K.F1], res["reward"], res["scores"]) == (0, 0.0, 0.0, 0.0, 0.0)


def test_max_tokens_per_turn_caps_every_turn_not_only_the_first(server, tok):
    """OpenRLHF resets max_tokens to the remaining context each turn; the agent's cap holds."""
    long_search = "<think>" + "let me think about this " * 40 + "</think>\n<search> capital of France </search>"
    cap = 24
    capped = run_episodes(make_cfg(server, max_tokens_per_turn=cap), tok, [[long_search, long_search, ANSWER]])[0]
    assert all(e - s <= cap for s, e in capped["action_ranges"]) and len(capped["action_ranges"]) >= 2
    # the scripted engine cuts at max_tokens, so an uncapped run keeps the long first turn whole
    free = run_episodes(make_cfg(server), tok, [[long_search, ANSWER]])[0]
    assert free["action_ranges"][0][1] - free["action_ranges"][0][0] > cap


def test_a_run_without_a_sandbox_answers_code_with_an_error_and_sends_nothing(tok):
    """``sandbox_url: null`` (the demo's and the GPU smoke's --no-sandbox): a <code> action is a
    counted, failed code call whose observation says why; no request leaves the agent, so code
    never reaches whatever listens on the default port."""
    with MiniToolServer(CORPUS) as srv:
        cfg = config_from_dict({**dict(retriever_url=srv.url("/retrieve"), web_search_url=srv.url("/search"),
                                       retries=1, backoff_s=0.01, request_timeout_s=5),
                                "sandbox_url": None, "template": "deep_research", "reward": "gaia"})
        code = "<think>compute</think><code>\nprint(6 * 7)\n</code>"
        (res,) = run_episodes(cfg, tok, [[code, "<think>ok</think><answer>42</answer>"]], label="42.0")
        assert sum(srv.requests.values()) == 0
    meta = res["extra_logs"]
    assert (meta[K.CODE_CALLS], meta[K.CODE_ERRORS], meta[K.TOOL_ERRORS]) == (1, 1, 1)
    assert "<result>code execution failed: no code sandbox in this run (sandbox_url: null)</result>" in \
        tok.decode(res["observation_tokens"])
