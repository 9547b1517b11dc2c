"""A small run folder written from real agent episodes: the inspector tests' input and the docs
screenshot's.

Everything is the real code path of the single-machine runner except the policy: OpenRLHF's
``MultiTurnAgentExecutor`` (our ``AgentExecutor``) runs every trajectory against real tools on
loopback (``MiniToolServer``: Search-R1 ``/retrieve``, SandboxFusion ``/run_code`` running the
code in a subprocess), with the real tokenizer; the *policy text* is scripted at the engine
boundary (``agent_fakes.ScriptedEngine`` (tests/agent_fakes.py)). Samples go through ``tensorize_response``, the
runner's advantages (strata from the agent's info, the stratified estimator, CalibAdv on the
token path), :func:`records_from_samples` and :class:`RolloutWriter`; metrics through
``MetricsLogger``. The scripts make, by construction, a group with three strata and reward
variance, a search + code group, and a group without reward variance (all answers wrong).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from agent_fakes import MiniToolServer, ScriptedEngine

from agent_env.config import AgentConfig
from agent_env.openrlhf_agent import AgentExecutor
from agent_env.tools import get_toolset
from openrlhf_sgrpo.calibadv import CalibAdvConfig
from openrlhf_sgrpo.rollout_records.sources import records_from_samples
from openrlhf_sgrpo.rollout_records.store import RolloutWriter

CORPUS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "1", "contents": '"Lyon"\nLyon is the third-largest city of France.'},
    {"id": "2", "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare around 1600.'},
    {"id": "3", "contents": '"Marseille"\nMarseille is a port city in the south of France.'},
]


def _think(text: str) -> str:
    return f"<think>{text}</think>\n"


def search(query: str, why: str = "I should look this up.") -> str:
    return _think(why) + f"<search> {query} </search>"


def code(src: str) -> str:
    return _think("Let me compute it.") + f"<code>\n```python\n{src}\n```\n</code>"


def answer(text: str, why: str = "I know enough now.") -> str:
    return _think(why) + f"<answer> {text} </answer>"


@dataclass(frozen=True)
class ScriptedPrompt:
    qid: str
    question: str
    golds: list[str]
    scripts: list[list[str]]  # one list of turn texts per sample


# Markup in model text must stay text in the report (it is untrusted).
HOSTILE = "</script><script>window.__pwned = 1</script><b>bold?</b>"

STEPS: list[list[ScriptedPrompt]] = [
    [
        ScriptedPrompt("q-france", "What is the capital of France?", ["Paris"], [
            [answer("Paris", "I remember this one.")],
            [answer("Lyon", "Probably the biggest city.")],
            [search("capital of France"), answer("Paris")],
            [search("France city"), search("Marseille port"), answer("Marseille")],
        ]),
        ScriptedPrompt("q-product", "What is 6 times 7?", ["42"], [
            [code("print(6 * 7)"), answer("42")],
            [answer("48", "Six sevens are forty-eight.")],
            [code("print(6 * 7)"), answer("42")],
            ["I think the answer is 42.", answer("42")],
        ]),
        ScriptedPrompt("q-hamlet", "Who wrote Hamlet?", ["William Shakespeare"], [
            [answer("Christopher Marlowe")],
            [search("Hamlet author"), answer("Francis Bacon")],
            [search("Hamlet"), search("Hamlet tragedy 1600"), answer("Marlowe")],
            [answer(HOSTILE, "Markup " + HOSTILE)],
        ]),
    ],
    [
        ScriptedPrompt("q-france", "What is the capital of France?", ["Paris"], [
            [search("capital of France"), answer("Paris")],
            [search("capital of France"), answer("Paris")],
            [answer("Paris")],
            [search("France"), search("capital city France"), answer("Paris")],
        ]),
        ScriptedPrompt("q-hamlet", "Who wrote Hamlet?", ["William Shakespeare"], [
            [search("Hamlet author"), answer("William Shakespeare")],
            [answer("Marlowe")],
            [search("Hamlet author"), answer("Shakespeare")],
            [search("Hamlet"), code("print('Shakespeare')"), answer("William Shakespeare")],
        ]),
    ],
]
EVAL = [ScriptedPrompt("q-france", "What is the capital of France?", ["Paris"], [[search("capital of France"),
                                                                                  answer("Paris")]]),
        ScriptedPrompt("q-hamlet", "Who wrote Hamlet?", ["William Shakespeare"], [[answer("Marlowe")]])]

N_SAMPLES = 4
MAX_LEN = 2048
ALPHA = 0.6


def adv_config():
    """The trainer's advantage config for these runs: Stratified GRPO, alpha 0.6, CalibAdv on."""
    from openrlhf_sgrpo.local.experience_maker import AdvantageConfig

    return AdvantageConfig(estimator="stratified_grpo", alpha=ALPHA, calibadv=CalibAdvConfig())


def agent_config(server: MiniToolServer) -> AgentConfig:
    """Search + code + answer (the deep-research template), EM reward, tools on ``server``."""
    return AgentConfig(retriever_url=server.url("/retrieve"), sandbox_url=server.url("/run_code"),
                       template="deep_research", reward="em", max_turns=3, topk=2, retries=1, backoff_s=0.01)


def execute(cfg: AgentConfig, tokenizer, prompts: list[ScriptedPrompt]) -> list[dict]:
    """Executor responses for every (prompt, sample), prompt-contiguous; each trajectory has its
    own scripted engine."""
    from openrlhf_sgrpo.local.rollout import label_of
    from openrlhf_sgrpo.engine.sampling import CompletionOutput, RequestOutput, SamplingParams

    async def main():
        executor = AgentExecutor(cfg)
        try:
            return await asyncio.gather(*[
                executor.execute(p.question, label_of(p.golds), SamplingParams(max_tokens=None), MAX_LEN, tokenizer,
                                 ScriptedEngine(tokenizer, script, RequestOutput, CompletionOutput))
                for p in prompts for script in p.scripts])
        finally:
            await get_toolset(cfg).close()
    return asyncio.run(main())


def _token_advantages(samples, adv, pad_id: int) -> list[torch.Tensor]:
    """The runner's token path: upstream compute_reward + returns, then CalibAdv (as in _update)."""
    from openrlhf_sgrpo.local.experience import collate
    from openrlhf_sgrpo.local.experience_maker import apply_calibadv, token_advantages

    mask = collate(samples, pad_id).action_mask
    token_adv = token_advantages(adv.advantages, mask)
    token_adv, _ = apply_calibadv(token_adv, mask, samples, adv.advantages, N_SAMPLES, adv_config().calibadv)
    return [token_adv[i, : s.action_mask.numel()] for i, s in enumerate(samples)]


def scripted_run(run_dir: str | Path, tokenizer) -> dict[str, list[dict]]:
    """Write ``run_dir/rollouts`` (2 train steps, 1 eval) and ``metrics.jsonl``; return the
    written group records by ``'<phase>/<step>'``."""
    from openrlhf_sgrpo.local.experience import tensorize_response
    from openrlhf_sgrpo.local.experience_maker import sample_advantages
    from openrlhf_sgrpo.local.step_log import StepLogger

    run_dir = Path(run_dir)
    writer = RolloutWriter(run_dir)
    logger = StepLogger(run_dir, tensorboard=False, use_wandb=False)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    written: dict[str, list[dict]] = {}
    with MiniToolServer(CORPUS) as srv:
        cfg = agent_config(srv)
        for step, prompts in enumerate(STEPS, start=1):
            samples = [tensorize_response(r, MAX_LEN) for r in execute(cfg, tokenizer, prompts)]
            adv = sample_advantages(samples, N_SAMPLES, adv_config())
            groups = records_from_samples(samples, tokenizer, N_SAMPLES, phase="train", step=step, adv_cfg=adv_config(),
                                          advantages=adv.advantages,
                                          token_advantages=_token_advantages(samples, adv, pad_id),
                                          prompt_ids=[p.qid for p in prompts])
            writer.write_step("train", step, groups)
            written[f"train/{step}"] = groups
            logger.log(step, {"reward": float(adv.rewards.mean()), "em": _mean(samples, "em"),
                              "tool_calls": _mean(samples, "tool_calls"), **adv.metrics})
        eval_groups = []
        # one greedy trajectory per question, appended as each finishes: the one-turn question first,
        # so the file's order (finishing order) is not the order the inspector shows (by group)
        for p in reversed(EVAL):
            (sample,) = [tensorize_response(r, MAX_LEN) for r in execute(cfg, tokenizer, [p])]
            (group,) = records_from_samples([sample], tokenizer, 1, phase="eval", step=len(STEPS),
                                            prompt_ids=[p.qid], dataset="scripted")
            writer.append("eval", len(STEPS), [group])
            eval_groups.append(group)
        written[f"eval/{len(STEPS)}"] = eval_groups
    logger.close()
    (run_dir / "scripted_run.json").write_text(json.dumps({"steps": len(STEPS), "n_samples": N_SAMPLES}))
    return written


def _mean(samples, key: str) -> float:
    return sum(s.info.get(key, 0.0) for s in samples) / len(samples)
