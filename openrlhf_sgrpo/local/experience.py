"""Agent responses → tensors, exactly as OpenRLHF's ``SamplesGenerator`` does it, then padded batches.

``SamplesGenerator._process_response_into_experience`` cannot be imported here: its module
imports ``vllm`` at the top. :func:`tensorize_response` is the same tensorization (sequences,
attention mask, the action mask shifted by one, rollout log-probs, response length, clip flag,
info from ``extra_logs``); ``tests/test_local_experience.py`` checks it field by field against
the upstream method (the test alone stubs the vllm import to reach it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Sample:
    """One trajectory as 1-D tensors (OpenRLHF's ``Experience`` fields, unbatched)."""

    sequences: torch.Tensor  # [L] prompt + actions + tool outputs, truncated to max_len
    attention_mask: torch.Tensor  # [L]
    action_mask: torch.Tensor  # [L-1]: column i marks sequences[i+1] as a policy token
    rollout_log_probs: torch.Tensor | None  # [L-1] or None
    reward: float
    score: float
    response_length: int
    total_length: int
    is_clipped: bool
    truncated: bool
    info: dict[str, int | float] = field(default_factory=dict)
    prompt: str = ""
    label: str = ""
    scripted: bool = False  # its first turn came from a FirstTurnScript, not from sampling


def tensorize_response(response: dict, max_len: int) -> Sample:
    """Mirror of upstream ``_process_response_into_experience`` for one executor response."""
    tokens = list(response["observation_tokens"])
    sequences = torch.tensor(tokens, dtype=torch.long)
    attention_mask = torch.ones(len(tokens), dtype=torch.long)
    action_mask = torch.zeros_like(attention_mask)
    for start, end in response["action_ranges"]:
        action_mask[start:end] = 1
    sequences, attention_mask = sequences[:max_len], attention_mask[:max_len]
    action_mask = action_mask[1:max_len]
    logps = response.get("rollout_log_probs")
    rollout_log_probs = torch.tensor(logps[1:max_len]) if logps is not None else None
    ones = torch.where(action_mask)[0]
    response_length = int(ones[-1] - ones[0] + 1) if len(ones) else 0
    total_length = int(attention_mask.sum())
    info = {}
    for key, value in (response.get("extra_logs") or {}).items():
        info[key] = _info_scalar(value)
    reward, score = response.get("reward"), response.get("scores")
    return Sample(
        sequences=sequences, attention_mask=attention_mask, action_mask=action_mask,
        rollout_log_probs=rollout_log_probs,
        reward=float(reward) if reward is not None else 0.0,
        score=float(score) if score is not None else float(reward or 0.0),
        response_length=response_length, total_length=total_length, is_clipped=total_length >= max_len,
        truncated=bool(response.get("truncated", False)), info=info,
        prompt=str(response.get("prompt", "")), label=str(response.get("label", "")),
    )


@dataclass
class Batch:
    """Right-padded tensors for a forward pass over several samples."""

    sequences: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    action_mask: torch.Tensor  # [B, L-1]

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum())


def collate(samples: list[Sample], pad_id: int) -> Batch:
    """Right-pad to the longest sample (padding is masked out of attention and actions)."""
    if not samples:
        raise ValueError("collate() needs at least one sample")
    width = max(int(s.sequences.numel()) for s in samples)
    seqs = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    acts = torch.zeros((len(samples), width - 1), dtype=torch.long)
    for i, s in enumerate(samples):
        n = s.sequences.numel()
        seqs[i, :n], attn[i, :n] = s.sequences, s.attention_mask
        acts[i, : s.action_mask.numel()] = s.action_mask
    return Batch(seqs, attn, acts)


def _info_scalar(value) -> int | float:
    """An extra_logs value as upstream stores it (``torch.tensor([value])``): ints stay ints, so
    63-bit document ids (agent_env.metadata.encode_doc_id) survive exactly; a float64 would round
    ids above 2**53 and make two different documents look alike to CalibAdv."""
    if isinstance(value, torch.Tensor):
        value = value.flatten()[0].item()
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else float(value)


def info_tensor(samples: list[Sample], key: str) -> torch.Tensor:
    """One ``info`` key across samples as a tensor (the shape OpenRLHF's info has after stacking):
    int64 when every value is an int (doc ids, token ranges), else float64; with a message that
    names the agent when the key is missing."""
    missing = [i for i, s in enumerate(samples) if key not in s.info]
    if missing:
        raise KeyError(f"sample {missing[0]} has no info key {key!r}; the agent's extra_logs hold "
                       f"{sorted(samples[missing[0]].info)[:12]}...")
    values = [s.info[key] for s in samples]
    exact = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    return torch.tensor(values, dtype=torch.int64 if exact else torch.float64)
