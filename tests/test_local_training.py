"""End-to-end: 2 steps of Stratified GRPO on the tiny Qwen2 (real tokenizer) with the real
retriever (MiniLM over real Wikipedia extracts) and the real sandbox, then resume to step 3.

A randomly initialised model never writes a tool call, so every reward would be 0 and the
update a no-op; a few supervised steps first teach it the action *format* (``<search> ...
</search>`` or ``<answer> ... </answer>`` after the question, see ``local/warmup.py``), so
sampled trajectories differ in tool calls (strata) and reward (Search-R1's format reward plus
F1 against the gold).
"""

from __future__ import annotations

import json
import pytest
import torch
from transformers import AutoModelForCausalLM

from agent_env.config import AgentConfig
from openrlhf_sgrpo import assets
from openrlhf_sgrpo.demo.corpus import write_corpus
from openrlhf_sgrpo.demo.fanout import answerable_subquestions, load_extracts, split
from openrlhf_sgrpo.local.hf_engine import HFGenerationEngine
from openrlhf_sgrpo.local.metrics_log import read_metrics
from openrlhf_sgrpo.local.rollout import AgentRollout
from openrlhf_sgrpo.local.services import cached_index_for, local_services
from openrlhf_sgrpo.local.trainer import LocalTrainer, TrainConfig
from openrlhf_sgrpo.local.warmup import format_warmup

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world():
    extracts = load_extracts(assets.wiki_extracts_json())
    subs = answerable_subquestions(assets.fanoutqa_dev_json(), extracts)
    train, _ = split(subs, 4, seed=0)
    train = [s.as_question() for s in train[:12]]
    titles = {s.evidence_title for s in subs[:16]}
    corpus = write_corpus(extracts, titles, 16)
    index = cached_index_for(corpus, progress=False)
    with local_services(index) as urls:
        yield train, urls


def _trainer(world, out, steps, model, tok):
    train, urls = world
    cfg = AgentConfig(retriever_url=urls.retriever_url, sandbox_url=urls.sandbox_url, template="none",
                      max_turns=2, max_obs_tokens=48, reward="f1", format_reward=True)
    rollout = AgentRollout(HFGenerationEngine(model, tok, seed=1), tok, cfg, max_len=192, max_tokens_per_turn=16)
    tcfg = TrainConfig(steps=steps, prompts_per_step=2, n_samples=4, micro_batch_size=4, lr=1e-3, seed=0)
    return LocalTrainer(model, tok, rollout, train, tcfg, out), rollout


def test_two_steps_change_weights_log_strata_and_resume_at_step_3(world, tmp_path):
    model, tok = assets.tiny_qwen2(seed=0)
    format_warmup(model, tok, world[0])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer, rollout = _trainer(world, tmp_path, 2, model, tok)
    try:
        records = trainer.train(progress=False)
    finally:
        rollout.close()
    assert [r["step"] for r in records] == [1, 2]
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    rewards = [(r["reward"], r["reward_std"]) for r in records]
    assert changed, f"two RL steps left every weight unchanged (reward mean/std per step: {rewards})"
    rows = read_metrics(tmp_path / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["sgrpo/strata_per_prompt"] >= 1.0
        assert sum(r["strata_hist"].values()) == 8
        assert "sgrpo/var_reduction" in r and "time/generate_busy_s" in r
    assert any(r["tool_calls"] > 0 for r in rows), "the warmed-up policy never called a tool"
    assert (tmp_path / "checkpoints" / "step_2" / "trainer_state.json").exists()

    # Resume in a fresh trainer with a fresh model: it must start from the saved step-2 weights.
    torch.manual_seed(123)
    model2 = AutoModelForCausalLM.from_config(model.config)
    trainer2, rollout2 = _trainer(world, tmp_path, 3, model2, tok)
    assert trainer2.resume()
    assert trainer2.step == 2
    saved = torch.load(tmp_path / "checkpoints" / "step_2" / "model.pt", weights_only=True)
    assert all(torch.equal(v, saved[k]) for k, v in model2.state_dict().items())
    try:
        records2 = trainer2.train(progress=False)
    finally:
        rollout2.close()
    assert [r["step"] for r in records2] == [3]
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_run_each_refills_its_window_instead_of_waiting_for_a_chunk(world):
    """The evaluation scheduler: at most `concurrency` trajectories in flight, and a slow one does
    not hold back the others (a chunked loop would wait for it before starting question 3)."""
    import asyncio

    train, urls = world
    model, tok = assets.tiny_qwen2(seed=2)
    cfg = AgentConfig(retriever_url=urls.retriever_url, sandbox_url=urls.sandbox_url, template="none",
                      max_turns=2, max_obs_tokens=48, reward="f1")
    rollout = AgentRollout(HFGenerationEngine(model, tok, seed=1), tok, cfg, max_len=192, max_tokens_per_turn=8)
    real, live = rollout._execute, {"now": 0, "max": 0}

    async def observed(prompt, label, greedy):
        live["now"] += 1
        live["max"] = max(live["max"], live["now"])
        try:
            if prompt == train[0].question:
                await asyncio.sleep(3.0)  # the slow question
            return await real(prompt, label, greedy)
        finally:
            live["now"] -= 1

    rollout._execute = observed
    order: list[int] = []
    try:
        qs = train[:6]
        timing = rollout.run_each([q.question for q in qs], [q.golds for q in qs], 2,
                                  lambda i, sample: order.append(i) if sample.info else None, progress=False)
    finally:
        rollout.close()
    assert sorted(order) == list(range(6))
    assert live["max"] == 2
    assert order[-1] == 0, f"the slow question held the others back: {order}"
    assert timing["time/generate_busy_s"] > 0
