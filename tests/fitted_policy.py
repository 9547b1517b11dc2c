"""A tiny Qwen2 fitted to one first action per question, shared by the engine tests.

The engine tests need a policy whose behaviour holds by construction on any CPU: under the
deep-research prompt (the template that offers ``<code>``) the first question searches, the second
runs code, the third answers (the gold or a wrong name, half and half). Fitted to a loss near the
half-and-half floor, sampled at a moderate temperature or greedily, every batch reaches the
retriever and the sandbox. Fitting takes 200 AdamW steps (minutes on 2 busy cores), so the
folder is cached in the asset cache under a hash of its recipe: one fit per machine.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from openrlhf_sgrpo import assets

TEMPLATE = "deep_research"  # search, code and answer
QUESTIONS = [("which city is the capital of france", "Paris"),
             ("which river flows through cairo", "Nile"),
             ("who wrote the play hamlet", "Shakespeare")]
CODE = "print(6 * 7)"
CODE_OUTPUT = "42"
WRONG_ANSWER = "Marlowe"
STEPS = 200
MAX_LOSS = 0.2  # the half-and-half answer alone costs ~0.03 per action token


def action_pairs(tok) -> list[tuple[str, str]]:
    from agent_env.templates import build_prompt

    (search_q, _), (code_q, _), (answer_q, gold) = QUESTIONS
    return ([(build_prompt(TEMPLATE, search_q, tok), f"<search> {search_q.split()[-1]} </search>")] * 2
            + [(build_prompt(TEMPLATE, code_q, tok), f"<code> {CODE} </code>")] * 2
            + [(build_prompt(TEMPLATE, answer_q, tok), f"<answer> {gold} </answer>"),
               (build_prompt(TEMPLATE, answer_q, tok), f"<answer> {WRONG_ANSWER} </answer>")])


def _recipe() -> str:
    return hashlib.sha256(json.dumps([QUESTIONS, CODE, WRONG_ANSWER, STEPS, TEMPLATE, assets.TINY_HEAD_DIM])
                          .encode()).hexdigest()[:12]


def fitted_policy_dir() -> Path:
    """The fitted policy's folder (weights + tokenizer), fitted on first use."""
    from openrlhf_sgrpo.local.warmup import format_warmup

    folder = assets.cache_dir() / "test-policies" / f"action-policy-{_recipe()}"
    if (folder / "config.json").exists():
        return folder
    model, tok = assets.tiny_qwen2(seed=0)
    loss = format_warmup(model, tok, [], steps=STEPS, pairs=action_pairs(tok), batch_size=8)
    assert loss < MAX_LOSS, f"the tiny policy did not fit its actions (loss {loss:.3f})"
    assets.publish_pretrained(folder, model, tok)
    return folder
