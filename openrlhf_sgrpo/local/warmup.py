"""A few supervised steps that teach a *randomly initialised* model the agent's action format.

A random tiny model never writes ``<search>...</search>``, so every trajectory has zero tool
calls and zero reward and RL has nothing to work with. Tests and benchmarks that use the tiny
Qwen2 first fit it briefly on ``question <search> word </search>`` and ``question <answer>
gold </answer>`` strings (loss on the action only); sampling then yields a real mix of
searches and answers (several strata per prompt). The demo does the same "cold start" for
SmolLM2-135M-Instruct, which answers in prose and never uses the tags on its own (R1-style
pipelines also fine-tune on the format before RL).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from openrlhf_sgrpo.local.data import Question
from openrlhf_sgrpo.local.experience import Batch
from openrlhf_sgrpo.local.loss import action_log_probs
from openrlhf_sgrpo.local.trainer import make_optimizer


def last_word(question: str) -> str:
    return question.split()[-1]


def action_format_pairs(questions: list[Question], prompt_fn: Callable[[str], str] = str,
                        query_fn: Callable[[str], str] = last_word, sep: str = " ") -> list[tuple[str, str]]:
    """(prompt, action) pairs per question: one ``<search>`` action and one ``<answer>`` with the gold.

    ``sep`` goes between prompt and action (" " after a bare question, "" after a chat prompt).
    """
    pairs = []
    for q in questions:
        prompt = prompt_fn(q.question)
        pairs.append((prompt, f"{sep}<search> {query_fn(q.question)} </search>"))
        pairs.append((prompt, f"{sep}<answer> {q.golds[0]} </answer>"))
    return pairs


def _batch(tokenizer, pairs: list[tuple[str, str]], pad_id: int) -> Batch:
    """Right-padded ids whose action mask marks the action tokens (the only ones scored)."""
    rows = []
    for question, action in pairs:
        q = tokenizer(question, add_special_tokens=False)["input_ids"]
        a = tokenizer(action, add_special_tokens=False)["input_ids"]
        rows.append((q + a, len(q)))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    actions = torch.zeros((len(rows), width - 1), dtype=torch.long)
    for i, (seq, n_prompt) in enumerate(rows):
        ids[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq), 1
        actions[i, n_prompt - 1: len(seq) - 1] = 1  # column j scores token j + 1
    return Batch(ids, mask, actions)


def format_warmup(model, tokenizer, questions: list[Question], steps: int = 60, lr: float = 1e-2,
                  batch_size: int = 8, seed: int = 0, pairs: list[tuple[str, str]] | None = None,
                  progress: bool = False) -> float:
    """Fit the action format (mean NLL of the action tokens only); returns the last loss.

    ``pairs`` overrides the default (question, action) pairs, e.g. with chat-rendered prompts.
    The log-probs come from the runner's :func:`~openrlhf_sgrpo.local.loss.action_log_probs`,
    so no logits are computed for the prompt.
    """
    pairs = pairs if pairs is not None else action_format_pairs(questions)
    if not pairs:
        raise ValueError("format_warmup needs at least one question")
    rng = random.Random(seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    opt = make_optimizer(model, lr, weight_decay=0.01)
    model.train()
    loss = torch.tensor(float("nan"))
    bar = tqdm(range(steps), desc="format warm-up", unit="step", disable=not progress, dynamic_ncols=True)
    try:
        for _ in bar:
            batch = _batch(tokenizer, rng.sample(pairs, min(batch_size, len(pairs))), pad_id)
            logp = action_log_probs(model, batch)
            mask = batch.action_mask.to(logp.device)
            loss = -(logp * mask).sum() / mask.sum()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", refresh=False)
    finally:
        model.eval()
    return float(loss.detach())
