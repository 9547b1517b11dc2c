"""A few supervised steps that teach a *randomly initialised* model the agent's action format.

A random tiny model never writes ``<search>...</search>``, so every trajectory has zero tool
calls and zero reward and RL has nothing to work with. Tests and benchmarks that use the tiny
Qwen2 first fit it briefly on ``question <search> word </search>`` and
``question <answer> gold </answer>`` strings (loss on the action only); sampling then yields a real mix of searches and
answers (several strata per prompt). Real policies (SmolLM2, Qwen2.5) do not need this.
"""

from __future__ import annotations

import random

import torch

from openrlhf_sgrpo.local.data import Question


def action_format_pairs(questions: list[Question]) -> list[tuple[str, str]]:
    """(question, action) pairs: a search for the question's last word, or the gold answer."""
    pairs = []
    for q in questions:
        pairs.append((q.question, f" <search> {q.question.split()[-1]} </search>"))
        pairs.append((q.question, f" <answer> {q.golds[0]} </answer>"))
    return pairs


def _batch(tokenizer, pairs: list[tuple[str, str]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels that score only the action tokens."""
    rows = []
    for question, action in pairs:
        q = tokenizer(question, add_special_tokens=False)["input_ids"]
        a = tokenizer(action, add_special_tokens=False)["input_ids"]
        rows.append((q + a, [-100] * len(q) + a))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (seq, lab) in enumerate(rows):
        ids[i, : len(seq)], labels[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq), torch.tensor(lab), 1
    return ids, mask, labels


def format_warmup(model, tokenizer, questions: list[Question], steps: int = 60, lr: float = 1e-2,
                  batch_size: int = 8, seed: int = 0) -> float:
    """Fit the action format (loss on the action tokens only); returns the last loss."""
    if not questions:
        raise ValueError("format_warmup needs at least one question")
    rng = random.Random(seed)
    pairs = action_format_pairs(questions)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        ids, mask, labels = _batch(tokenizer, rng.sample(pairs, min(batch_size, len(pairs))), pad_id)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    return float(loss.detach())
