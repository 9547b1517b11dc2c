"""The paper scripts' ``--data.max_len`` leaves room for the answer after every tool turn is full.

Worst case of a Search-R1 trajectory: ``max_turns`` searches, each action at the per-turn cap and
each observation at its cap (plus the ``<information>`` wrapper), then the final answer turn.
The budget is read from the script itself (``DRY_RUN=1``: OpenRLHF's parsed config and the
rendered agent config), and the worst case is *run*: OpenRLHF's executor with our agent, the
real Qwen2 tokenizer (Qwen2.5's vocabulary), the real retriever over long passages, and a scripted
engine (the vLLM boundary stand-in) that fills every turn to the cap.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from agent_fakes import ScriptedEngine

from agent_env import info_keys as K
from agent_env.config import config_from_dict
from agent_env.executor import AgentExecutor
from agent_env.templates import search_r1_base
from agent_env.tools import get_toolset
from openrlhf_sgrpo import assets
from openrlhf_sgrpo.engine.sampling import CompletionOutput, RequestOutput, SamplingParams

REPO = Path(__file__).resolve().parent.parent
FILLER = " and then"


@pytest.fixture(scope="module")
def paper_budget(tmp_path_factory) -> dict:
    """--data.max_len and the agent's caps, as train_sgrpo_base.sh sets them."""
    run = tmp_path_factory.mktemp("budget")
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "SAVE_PATH": str(run)}
    out = subprocess.run(["bash", "examples/qwen2.5-3b/train_sgrpo_base.sh"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    cfg = json.loads(out.stdout)
    agent = yaml.safe_load((run / "agent_config.yaml").read_text())
    return {"max_len": cfg["data"]["max_len"], "max_new_tokens": cfg["rollout"]["max_new_tokens"], **agent}


@pytest.fixture(scope="module")
def tok():
    return assets.load_qwen2_tokenizer()


@pytest.fixture(scope="module")
def long_passage_retriever(tmp_path_factory):
    """The real retriever over passages so long that every observation hits max_obs_tokens."""
    from openrlhf_sgrpo.local.services import cached_index_for, local_services

    text = " ".join(f"France has many cities, number {i} of them is old." for i in range(120))
    corpus = tmp_path_factory.mktemp("corpus") / "long.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"City {i}"\n{text}'}) + "\n" for i in range(4)))
    with local_services(cached_index_for(corpus, progress=False), sandbox=False, topk=3) as urls:
        yield urls.retriever_url


def exactly(tok, action: str, n_tokens: int) -> str:
    """``<think>`` filler before ``action`` so the whole turn is exactly ``n_tokens`` tokens."""
    count = lambda text: len(tok(text, add_special_tokens=False)["input_ids"])
    k = 0
    while count(f"<think>{FILLER * k}</think>{action}") < n_tokens:
        k += 1
    text = f"<think>{FILLER * k}</think>{action}"
    assert count(text) == n_tokens, "filler does not tokenize additively; pick another filler"
    return text


def run_worst_case(budget: dict, tok, retriever_url: str, max_len: int) -> dict:
    cap, turns = budget["max_tokens_per_turn"], budget["max_turns"]
    script = [exactly(tok, "<search> cities of France </search>", cap)] * turns
    script.append(exactly(tok, "<answer> Paris </answer>", cap))
    cfg = config_from_dict({k: budget[k] for k in ("max_turns", "topk", "max_obs_tokens", "max_tokens_per_turn",
                                                   "template", "reward")} | {"retriever_url": retriever_url})

    async def main():
        try:
            return await AgentExecutor(cfg).execute(
                search_r1_base("Which city is the capital of France?"), '["Paris"]',
                SamplingParams(max_tokens=budget["max_new_tokens"]), max_len, tok,
                ScriptedEngine(tok, script, RequestOutput, CompletionOutput))
        finally:
            await get_toolset(cfg).close()

    return asyncio.run(main())


@pytest.mark.slow
def test_answer_turn_fits_after_every_tool_turn_is_full(paper_budget, tok, long_passage_retriever):
    budget = paper_budget
    cap, turns = budget["max_tokens_per_turn"], budget["max_turns"]
    assert (turns, cap, budget["max_obs_tokens"]) == (4, 500, 500)
    out = run_worst_case(budget, tok, long_passage_retriever, budget["max_len"])
    ranges = out["action_ranges"]
    meta = out["extra_logs"]
    assert [e - s for s, e in ranges] == [cap] * (turns + 1)  # every turn, the answer too, got its full cap
    assert meta[K.SEARCH_CALLS] == turns and meta[K.ANSWERED] == 1 and out["reward"] == 1.0
    assert len(out["observation_tokens"]) <= budget["max_len"]  # nothing cut by the trainer's max_len
    # the observations really were at their cap (else this is not the worst case)
    for (_, end), (nxt, _) in zip(ranges, ranges[1:]):
        assert nxt - end >= budget["max_obs_tokens"]


@pytest.mark.slow
def test_the_old_budget_left_no_answer_turn(paper_budget, tok, long_passage_retriever):
    """512 + 4 x (500 + 500), the scripts' formula before: the worst case can never be rewarded."""
    budget = paper_budget
    old = 512 + budget["max_turns"] * (budget["max_tokens_per_turn"] + budget["max_obs_tokens"])
    assert old < budget["max_len"]
    out = run_worst_case(budget, tok, long_passage_retriever, old)
    assert out["reward"] == 0.0 and out["extra_logs"][K.ANSWERED] == 0
