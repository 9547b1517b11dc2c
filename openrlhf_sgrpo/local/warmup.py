"""Supervised steps before RL: the action format alone, or whole expert trajectories.

A random tiny model never writes ``<search>...</search>``, so every trajectory has zero tool
calls and zero reward and RL has nothing to work with. Tests and benchmarks that use the tiny
Qwen2 first fit it briefly on ``question <search> word </search>`` and ``question <answer>
gold </answer>`` strings (loss on the action only); sampling then yields a real mix of
searches and answers (several strata per prompt). The demo does the same "cold start" for
SmolLM2-135M-Instruct, which answers in prose and never uses the tags on its own (R1-style
pipelines also fine-tune on the format before RL).

A format warm-up teaches the *first* action only: a model fitted on (prompt, action) pairs
searches but has never seen an observation, so it does not know what to do after one (the
earlier demo's warm-up policy searched on every question and then never answered).
:class:`ExpertEngine` + :func:`trajectory_warmup` teach the whole loop instead: scripted expert
turns (think, search, read the observation, search again where needed, answer) are run through
the real agent and tools (:class:`~openrlhf_sgrpo.local.rollout.AgentRollout` with this engine),
so the warm-up fits exactly the token sequences a rollout produces, observations included, with
the loss on the action tokens only (the sample's own action mask).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from openrlhf_sgrpo.engine.sampling import CompletionOutput, RequestOutput
from openrlhf_sgrpo.local.data import Question
from openrlhf_sgrpo.local.experience import Batch, Sample, collate
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
                  progress: bool = False, micro_batch_size: int | None = None) -> float:
    """Fit the action format (mean NLL of the action tokens only); returns the last loss.

    ``pairs`` overrides the default (question, action) pairs, e.g. with chat-rendered prompts.
    The log-probs come from the runner's :func:`~openrlhf_sgrpo.local.loss.action_log_probs`,
    so no logits are computed for the prompt.
    """
    pairs = pairs if pairs is not None else action_format_pairs(questions)
    if not pairs:
        raise ValueError("format_warmup needs at least one question")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return _fit(model, lambda rng: _batch(tokenizer, rng.sample(pairs, min(batch_size, len(pairs))), pad_id),
                steps, lr, seed, progress, "format warm-up", micro_batch_size)


def trajectory_warmup(model, tokenizer, samples: list[Sample], steps: int, lr: float, batch_size: int = 4,
                      seed: int = 0, progress: bool = False, micro_batch_size: int | None = None) -> float:
    """Fit whole trajectories (e.g. :class:`ExpertEngine` rollouts): the NLL of their action tokens
    (the tool outputs between turns are context, never targets); returns the last loss.

    ``micro_batch_size`` rows go through forward and backward at a time (default: the whole
    batch); the gradient is the same, one token mean over the batch, and the activations held at
    once shrink with it (SmolLM2, 4 expert trajectories: ~0.5 GB less peak with 1 row at a time)."""
    if not samples:
        raise ValueError("trajectory_warmup needs at least one trajectory")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return _fit(model, lambda rng: collate(rng.sample(samples, min(batch_size, len(samples))), pad_id),
                steps, lr, seed, progress, "trajectory warm-up", micro_batch_size)


def micro_batches(batch: Batch, size: int | None) -> list[Batch]:
    """``batch`` in row chunks of ``size`` (all of it for None), each cut to its own longest row
    (rows are right-padded), so a short chunk does not compute the long one's padding."""
    rows = batch.sequences.shape[0]
    size = rows if size is None else size
    if size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {size}")
    chunks = []
    for lo in range(0, rows, size):
        attn = batch.attention_mask[lo: lo + size]
        width = int(attn.sum(dim=1).max())
        chunks.append(Batch(batch.sequences[lo: lo + size, :width], attn[:, :width],
                            batch.action_mask[lo: lo + size, : width - 1]))
    return chunks


def backward_action_nll(model, batch: Batch, micro_batch_size: int | None = None) -> float:
    """Accumulate the gradient of ``batch``'s mean action-token NLL, ``micro_batch_size`` rows
    at a time (each part divides by the whole batch's action tokens); returns the loss."""
    tokens = batch.action_mask.sum()
    loss = 0.0
    for chunk in micro_batches(batch, micro_batch_size):
        logp = action_log_probs(model, chunk)
        part = -(logp * chunk.action_mask.to(logp.device)).sum() / tokens.to(logp.device)
        part.backward()
        loss += float(part.detach())
    return loss


def _fit(model, next_batch: Callable[[random.Random], Batch], steps: int, lr: float, seed: int, progress: bool,
         desc: str, micro_batch_size: int | None = None) -> float:
    """AdamW on the mean action-token NLL of ``steps`` batches, each through forward and backward
    in micro-batches whose losses divide by the whole batch's action tokens (so the accumulated
    gradient is the batch's token mean); the model is left in eval mode."""
    rng = random.Random(seed)
    opt = make_optimizer(model, lr, weight_decay=0.01)
    model.train()
    loss = float("nan")
    bar = tqdm(range(steps), desc=desc, unit="step", disable=not progress, dynamic_ncols=True)
    try:
        for _ in bar:
            loss = backward_action_nll(model, next_batch(rng), micro_batch_size)
            opt.step()
            opt.zero_grad(set_to_none=True)
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
    finally:
        model.eval()
    return loss


class ExpertEngine:
    """A generation engine that replays scripted turns instead of sampling.

    ``scripts`` maps a trajectory's prompt (the text the agent renders, as the executor tokenizes
    it) to its turns. ``generate`` finds the trajectory by the prompt its context opens with and
    returns the turn after the ones already taken (counted as the action closers since the
    prompt), whole: the agent and the tools run for real in between, so the second query can
    only be right if the first observation held the bridge entity.
    """

    def __init__(self, tokenizer, scripts: dict[str, list[str]]):
        self.tokenizer = tokenizer
        self.scripts: dict[tuple[int, ...], list[str]] = {}
        for prompt, turns in scripts.items():
            if not turns:
                raise ValueError(f"empty script for prompt {prompt[-80:]!r}")
            self.scripts[tuple(tokenizer(prompt, add_special_tokens=False)["input_ids"])] = list(turns)
        self.lengths = sorted({len(k) for k in self.scripts})

    def _find(self, ids: list[int]) -> tuple[list[str], int]:
        for n in self.lengths:
            turns = self.scripts.get(tuple(ids[:n]))
            if turns is not None:
                done = self.tokenizer.decode(ids[n:], skip_special_tokens=False)
                return turns, sum(done.count(c) for c in ("</search>", "</code>", "</answer>"))
        raise KeyError("no script for this prompt")

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None) -> RequestOutput:
        turns, k = self._find(list(prompt_token_ids))
        text = turns[min(k, len(turns) - 1)]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return RequestOutput(list(prompt_token_ids), [CompletionOutput(0, text, ids, "stop")])

    def sync_weights(self, model) -> int:
        """No weights: the engine interface's sync is a no-op here."""
        return 0

    def close(self) -> None:
        """Nothing to release."""
