"""End-to-end: 2 steps of Stratified GRPO on the tiny Qwen2 (real tokenizer) with the real
retriever (MiniLM over real Wikipedia extracts) and the real sandbox, then resume to step 3.

A randomly initialised model's samples are whatever the CPU's floating point makes of them, so
what the test needs holds by construction instead: the rollout scripts the first turn of
samples 0-2 of every group (``local/scripted.py``: the gold answer, a wrong answer, a search),
so every group has reward spread, every step a tool call and a non-zero update. Sample 3 of each
group is sampled. ``SGRPO_TEST_SEED_SHIFT`` shifts every seed here (see openrlhf_sgrpo.testing).
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from agent_env.config import AgentConfig
from openrlhf_sgrpo import assets
from openrlhf_sgrpo.demo.corpus import write_corpus
from openrlhf_sgrpo.demo.fanout import answerable_subquestions, load_extracts, split
from openrlhf_sgrpo.engine.hf import HFGenerationEngine
from openrlhf_sgrpo.local.rollout import AgentRollout
from openrlhf_sgrpo.local.scripted import spread_script
from openrlhf_sgrpo.local.services import cached_index_for, local_services
from openrlhf_sgrpo.local.step_log import read_step_log
from openrlhf_sgrpo.local.trainer import LocalTrainer, TrainConfig
from openrlhf_sgrpo.mechanism import METRIC_KEYS, STRATUM_NAMES
from openrlhf_sgrpo.testing import shifted_seed

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


def _agent_config(urls) -> AgentConfig:
    return AgentConfig(retriever_url=urls.retriever_url, sandbox_url=urls.sandbox_url, template="none",
                       max_turns=2, max_obs_tokens=48, reward="f1", format_reward=True)


def _trainer(world, out, steps, model, tok, engine_seed: int = 1):
    train, urls = world
    engine = HFGenerationEngine(model, tok, seed=shifted_seed(engine_seed))
    rollout = AgentRollout(engine, tok, _agent_config(urls), max_len=192, max_tokens_per_turn=16,
                           first_turn_script=spread_script)
    tcfg = TrainConfig(steps=steps, prompts_per_step=2, n_samples=4, micro_batch_size=4, lr=1e-3,
                       seed=shifted_seed(0))
    return LocalTrainer(model, tok, rollout, train, tcfg, out), rollout


def test_two_steps_change_weights_log_strata_and_resume_at_step_3(world, tmp_path):
    model, tok = assets.tiny_qwen2(seed=shifted_seed(0))
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
    rows = read_step_log(tmp_path / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["scripted_samples"] == 6 and r["reward_std"] > 0 and r["tool_calls"] > 0
        assert r["sgrpo/strata_per_prompt"] >= 2.0  # the scripted search is a stratum of its own
        assert sum(r["strata_hist"].values()) == 8
        assert r["optimizer_steps"] == 1 and r["grad_norm"] > 0
        assert "sgrpo/var_reduction" in r and "time/generate_busy_s" in r
        # the mechanism (openrlhf_sgrpo.mechanism) on the tool-call strata: every key, shares of
        # the step's 8 samples, and SAN's mass 0 in each stratum since the strata are tool calls
        assert set(METRIC_KEYS) <= set(r)
        assert sum(r[f"sgrpo/{name}/share"] for name in STRATUM_NAMES) == pytest.approx(1.0)
        assert max(abs(r[f"sgrpo/{name}/adv_mass_san"]) for name in STRATUM_NAMES) < 1e-6
        assert r["sgrpo/stratum0/share"] > 0 and r["sgrpo/stratum0/reward"] is not None
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
        result = trainer2.train_step()
    finally:
        rollout2.close()
    assert result.step == 3 and result.record["step"] == 3
    # Everything per sample sits in the step result, in prompt order.
    exp = result.experience
    assert len(exp.samples) == len(exp.token_advantages) == len(result.sample_updates) == 8
    assert exp.old_log_probs is None  # one optimizer step per rollout: the update's own log-probs
    assert [s.scripted for s in exp.samples] == [True, True, True, False] * 2
    assert exp.advantage.advantages[0] > 0 and exp.advantage.advantages[4] > 0  # the gold answers
    assert torch.allclose(0.6 * exp.advantage.san + 0.4 * exp.advantage.gn, exp.advantage.advantages)
    assert all(len(p) == 1 and "ratio_mean" in p[0] for p in result.sample_updates)
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]

    # Step 3 once more from the same checkpoint, on an engine whose own generator is elsewhere (as
    # a resumed run's is against an uninterrupted one's, or a reordered batch's): the step's seed
    # gives every trajectory the same draws (rollout.SeededCalls)
    model3 = AutoModelForCausalLM.from_config(model.config)
    trainer3, rollout3 = _trainer(world, tmp_path, 3, model3, tok, engine_seed=2)
    assert trainer3.resume() and trainer3.step == 2
    try:
        again = trainer3.train_step()
    finally:
        rollout3.close()
    first_draws = [s.sequences.tolist() for s in exp.samples]
    assert [s.sequences.tolist() for s in again.experience.samples] == first_draws


def test_run_each_refills_its_window_instead_of_waiting_for_a_chunk(world):
    """The evaluation scheduler: at most `concurrency` trajectories in flight, and a slow one does
    not hold back the others. The slow question waits until the five others have ended, so a
    chunked loop (which would wait for it before starting question 3) times out instead."""
    train, urls = world
    model, tok = assets.tiny_qwen2(seed=shifted_seed(2))
    rollout = AgentRollout(HFGenerationEngine(model, tok, seed=shifted_seed(1)), tok, _agent_config(urls),
                           max_len=192, max_tokens_per_turn=8)
    real, live = rollout._execute, {"now": 0, "max": 0}
    order: list[int] = []
    others_done = asyncio.Event()

    async def observed(prompt, label, greedy, script=None):
        live["now"] += 1
        live["max"] = max(live["max"], live["now"])
        try:
            if prompt == train[0].question:  # the slow question
                await asyncio.wait_for(others_done.wait(), timeout=120)
            return await real(prompt, label, greedy, script)
        finally:
            live["now"] -= 1

    def done(i: int, sample) -> None:
        order.append(i)
        if len(order) == 5:
            others_done.set()

    rollout._execute = observed
    try:
        qs = train[:6]
        timing = rollout.run_each([q.question for q in qs], [q.golds for q in qs], 2, done, progress=False)
    finally:
        rollout.close()
    assert sorted(order) == list(range(6))
    assert live["max"] == 2
    assert order[-1] == 0, f"the slow question held the others back: {order}"
    assert timing["time/generate_busy_s"] > 0
