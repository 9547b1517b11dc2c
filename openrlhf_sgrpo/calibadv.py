"""CalibAdv: calibrate token advantages of multi-turn search rollouts (pure torch, vectorized).

"Negative Advantage Is a Double-Edged Sword: Calibrating Advantage in GRPO for Deep Search"
(reference code: github.com/wujwyi/CalibAdv, option names from its ``algorithm.less_negative``
block). A rollout with a wrong final answer (A < 0) often made *good* searches on the way; a
plain group estimator punishes those turns as hard as the wrong answer. CalibAdv

1. finds the group's **silver docs**: documents retrieved by the group's good rollouts
   (format ok and F1 >= ``silver_f1``);
2. scores every search turn t of every rollout: ``s_t`` = share of the turn's documents that are
   silver *and* not already retrieved by an earlier turn (or slot) of the same rollout, so a
   repeated query or a repeated document earns nothing;
3. softens negative rollouts turn by turn: the tokens of turn t get ``A * (1 - s_t)``;
4. rebalances the answer segment per group so that ``sum |negative| = target_ratio * sum
   positive`` (default 1: equal mass), by scaling the positives (``adjust="positive"``) or the
   negatives; a group whose answer tokens are all positive or all negative gets 0 there.

It post-processes the token-level advantages of *any* group estimator (GRPO, RLOO, Stratified
GRPO, ...), so CalibAdv and Stratified GRPO compose. Inputs are plain tensors in prompt order
(``group_size`` consecutive rows per prompt); token ranges are in advantage-column space.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

# Turn kinds (the values agent_env writes into ``turn{k}_kind``; the math stays import-free).
KIND_PAD, KIND_NONE, KIND_SEARCH, KIND_CODE, KIND_ANSWER, KIND_INVALID = -1, 0, 1, 2, 3, 4
DOC_PAD = -1

ADJUST_SIDES: tuple[str, ...] = ("positive", "negative")
REBALANCE_SCOPES: tuple[str, ...] = ("answer", "response", "none")
DEFAULT_SILVER_F1 = 0.7
DEFAULT_TARGET_RATIO = 1.0


@dataclass(frozen=True)
class CalibAdvConfig:
    """CalibAdv options; the names follow the reference's ``less_negative`` switches."""

    silver_f1: float = DEFAULT_SILVER_F1  # F1 a formatted rollout needs for its docs to be silver
    target_ratio: float = DEFAULT_TARGET_RATIO  # sum|neg| / sum pos after rebalancing
    adjust: str = "positive"  # which side the rebalancing rescales
    rebalance: str = "answer"  # segment rebalanced per group: answer, the whole response, or none
    only_apply_risky: bool = False  # rebalance only groups whose sum|neg|/sum pos exceeds target_ratio
    softpenalty_first: bool = False  # soft-penalize turns before (True) or after (False) rebalancing
    aggressive_threshold: float | None = None  # s_t >= this zeroes the turn instead of scaling it
    positive_upper_limit: bool = False  # A + (max_group A - A) * s_t instead of A * (1 - s_t)
    reset2zero: bool = False  # positive rollouts: 0 on turn t when every rollout's s_t is 1

    def __post_init__(self) -> None:
        for message in config_errors(self):
            raise ValueError(message)


def config_errors(cfg: CalibAdvConfig | Any, prefix: str = "") -> list[str]:
    """Every problem with a CalibAdv setting (any object with its fields, e.g. parsed CLI args)."""
    errors = []
    if not (math.isfinite(cfg.silver_f1) and 0.0 <= cfg.silver_f1 <= 1.0):
        errors.append(f"{prefix}silver_f1 must be in [0, 1], got {cfg.silver_f1!r}")
    if not (math.isfinite(cfg.target_ratio) and cfg.target_ratio > 0):
        errors.append(f"{prefix}target_ratio must be a finite number > 0, got {cfg.target_ratio!r}")
    if cfg.adjust not in ADJUST_SIDES:
        errors.append(f"{prefix}adjust must be one of {ADJUST_SIDES}, got {cfg.adjust!r}")
    if cfg.rebalance not in REBALANCE_SCOPES:
        errors.append(f"{prefix}rebalance must be one of {REBALANCE_SCOPES}, got {cfg.rebalance!r}")
    thr = cfg.aggressive_threshold
    if thr is not None and not (math.isfinite(thr) and 0.0 < thr <= 1.0):
        errors.append(f"{prefix}aggressive_threshold must be in (0, 1] or None, got {thr!r}")
    return errors


# ---------------------------------------------------------------- turn scores (silver docs)

def _compact_ids(doc_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map int64 doc ids (hashes up to 2**63) to 0..U-1 so they can be combined with row ids."""
    uniq, inv = torch.unique(doc_ids.reshape(-1), return_inverse=True)
    return inv.reshape(doc_ids.shape), int(uniq.numel())


def _first_occurrence(row_keys: torch.Tensor) -> torch.Tensor:
    """[B, P] non-negative keys -> True where the key has not appeared earlier in the same row."""
    b, p = row_keys.shape
    span = int(row_keys.max()) + 1 if row_keys.numel() else 1
    flat = (row_keys + torch.arange(b, device=row_keys.device).unsqueeze(-1) * span).reshape(-1)
    order = torch.sort(flat, stable=True).indices  # stable: earlier positions first within a key
    sorted_keys = flat[order]
    first_sorted = torch.ones_like(sorted_keys, dtype=torch.bool)
    first_sorted[1:] = sorted_keys[1:] != sorted_keys[:-1]
    first = torch.empty_like(first_sorted)
    first[order] = first_sorted
    return first.reshape(b, p)


def good_rollouts(f1: torch.Tensor, format_ok: torch.Tensor, silver_f1: float = DEFAULT_SILVER_F1) -> torch.Tensor:
    """Rollouts whose documents define the group's silver set."""
    return format_ok.bool() & (f1 >= silver_f1)


def turn_scores(doc_ids: torch.Tensor, turn_kind: torch.Tensor, f1: torch.Tensor, format_ok: torch.Tensor,
                group_size: int, silver_f1: float = DEFAULT_SILVER_F1) -> torch.Tensor:
    """``s_t`` [B, T]: share of a search turn's docs that are silver and new to the rollout.

    Non-search turns and turns without documents score 0.
    """
    b, t, d = doc_ids.shape
    is_search = (turn_kind == KIND_SEARCH)
    valid = (doc_ids != DOC_PAD) & is_search.unsqueeze(-1)
    cid, u = _compact_ids(doc_ids)
    group = torch.arange(b, device=doc_ids.device) // group_size
    # Silver set membership through one sort-based isin on (group, doc) keys.
    keys = group.view(b, 1, 1) * u + cid
    pool_rows = good_rollouts(f1, format_ok, silver_f1).view(b, 1, 1) & valid
    silver = torch.isin(keys, keys[pool_rows]) & valid
    # Unseen earlier: first occurrence of the doc in the rollout (turn-major order); padded
    # slots get a per-position key that cannot collide with a real document.
    row_keys = torch.where(valid, cid, u + torch.arange(t * d, device=doc_ids.device).view(1, t, d))
    first = _first_occurrence(row_keys.reshape(b, t * d)).reshape(b, t, d)
    useful = (silver & first).sum(-1).to(torch.float32)
    n_docs = valid.sum(-1).to(torch.float32)
    return torch.where(n_docs > 0, useful / n_docs.clamp_min(1), torch.zeros_like(useful))


# ---------------------------------------------------------------- token masks

def turn_column_masks(turn_start: torch.Tensor, turn_end: torch.Tensor, width: int) -> torch.Tensor:
    """[B, T, A] True on the advantage columns [start, end) of each turn (clipped to [0, A))."""
    cols = torch.arange(width, device=turn_start.device).view(1, 1, width)
    return (cols >= turn_start.unsqueeze(-1)) & (cols < turn_end.unsqueeze(-1))


def answer_turn_index(turn_kind: torch.Tensor, turn_start: torch.Tensor, turn_end: torch.Tensor) -> torch.Tensor:
    """Index of each rollout's last non-empty turn (its answer segment), -1 when it has none."""
    present = (turn_kind != KIND_PAD) & (turn_end > turn_start)
    slots = torch.arange(turn_kind.shape[1], device=turn_kind.device).expand_as(turn_kind)
    return torch.where(present, slots, torch.full_like(slots, -1)).max(-1).values


# ---------------------------------------------------------------- the two calibrations

def soft_penalty(advantages: torch.Tensor, rollout_adv: torch.Tensor, scores: torch.Tensor,
                 turn_cols: torch.Tensor, turn_kind: torch.Tensor, group_size: int,
                 cfg: CalibAdvConfig) -> torch.Tensor:
    """Scale (or lift) the search-turn tokens of negative rollouts by their turn score."""
    search = turn_kind == KIND_SEARCH
    negative = (rollout_adv < 0).unsqueeze(-1) & search  # [B, T]
    cols = turn_cols.to(advantages.dtype)
    if cfg.positive_upper_limit:
        group_max = rollout_adv.view(-1, group_size).max(-1).values.repeat_interleave(group_size)
        lift = (group_max - rollout_adv).unsqueeze(-1) * scores * negative  # [B, T]
        out = advantages + torch.einsum("bt,bta->ba", lift.to(advantages.dtype), cols)
    else:
        keep = 1.0 - scores
        if cfg.aggressive_threshold is not None:
            keep = torch.where(scores >= cfg.aggressive_threshold, torch.zeros_like(keep), keep)
        cut = ((1.0 - keep) * negative).to(advantages.dtype)  # share removed per turn
        out = advantages * (1.0 - torch.einsum("bt,bta->ba", cut, cols))
    if cfg.reset2zero:
        # Mean score over the group's rollouts that searched at slot t; == 1 means "every one
        # found only new silver docs there": nothing to learn, so positives get 0 on it.
        s = (scores * search).view(-1, group_size, scores.shape[1]).sum(1)
        c = search.view(-1, group_size, scores.shape[1]).sum(1)
        trivial = ((c > 0) & (s >= c - 1e-9)).repeat_interleave(group_size, 0)  # [B, T]
        zero = ((rollout_adv > 0).unsqueeze(-1) & search & trivial).to(advantages.dtype)
        out = out * (1.0 - torch.einsum("bt,bta->ba", zero, cols))
    return out


def rebalance(advantages: torch.Tensor, scope: torch.Tensor, group_size: int, cfg: CalibAdvConfig
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """Per group, make ``sum |neg| = target_ratio * sum pos`` over the ``scope`` tokens."""
    b, a = advantages.shape
    g = b // group_size
    sc = scope.to(advantages.dtype)
    pos_mass = (advantages.clamp_min(0) * sc).view(g, -1).sum(-1)
    neg_mass = ((-advantages).clamp_min(0) * sc).view(g, -1).sum(-1)
    one_sided = (pos_mass == 0) | (neg_mass == 0)
    live = (pos_mass > 0) | (neg_mass > 0)
    apply = torch.ones_like(one_sided)
    if cfg.only_apply_risky:  # as the reference: skip groups already within the target
        apply = ~((pos_mass > 0) & (neg_mass / pos_mass.clamp_min(1e-30) <= cfg.target_ratio))
    zero = apply & one_sided & live
    scale = apply & ~one_sided
    if cfg.adjust == "positive":
        factor = neg_mass / (pos_mass * cfg.target_ratio).clamp_min(1e-30)
        pos_factor, neg_factor = torch.where(scale, factor, torch.ones_like(factor)), torch.ones_like(factor)
    else:
        factor = pos_mass * cfg.target_ratio / neg_mass.clamp_min(1e-30)
        pos_factor, neg_factor = torch.ones_like(factor), torch.where(scale, factor, torch.ones_like(factor))
    pos_factor = torch.where(zero, torch.zeros_like(pos_factor), pos_factor)
    neg_factor = torch.where(zero, torch.zeros_like(neg_factor), neg_factor)
    row_pos = pos_factor.repeat_interleave(group_size).unsqueeze(-1)
    row_neg = neg_factor.repeat_interleave(group_size).unsqueeze(-1)
    factor_tok = torch.where(advantages > 0, row_pos, row_neg)
    out = torch.where(scope, advantages * factor_tok, advantages)
    stats = {
        "calibadv/rebalanced_group_share": float(scale.to(torch.float32).mean()),
        "calibadv/zeroed_group_share": float(zero.to(torch.float32).mean()),
        "calibadv/rebalance_factor": float(factor[scale].mean()) if bool(scale.any()) else 1.0,
    }
    return out, stats


# ---------------------------------------------------------------- entry point

def calibadv_token_advantages(
    advantages: torch.Tensor,
    turn_kind: torch.Tensor,
    turn_start: torch.Tensor,
    turn_end: torch.Tensor,
    doc_ids: torch.Tensor,
    f1: torch.Tensor,
    format_ok: torch.Tensor,
    group_size: int,
    action_mask: torch.Tensor | None = None,
    rollout_advantage: torch.Tensor | None = None,
    config: CalibAdvConfig | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Calibrated token advantages [B, A] and batch stats.

    Shapes: advantages/action_mask [B, A]; turn_kind/turn_start/turn_end [B, T] (advantage
    columns, half-open, -1 padded); doc_ids [B, T, D] (-1 padded); f1/format_ok/
    rollout_advantage [B]. Rows are prompt-contiguous, ``group_size`` per prompt.
    ``rollout_advantage`` decides a rollout's sign (default: its masked mean token advantage).
    """
    cfg = config or CalibAdvConfig()
    _validate(advantages, turn_kind, turn_start, turn_end, doc_ids, f1, format_ok, group_size, action_mask)
    adv = advantages.clone()
    mask = torch.ones_like(adv, dtype=torch.bool) if action_mask is None else action_mask.bool()
    if rollout_advantage is None:
        rollout_advantage = (adv * mask).sum(-1) / mask.sum(-1).clamp_min(1)
    scores = turn_scores(doc_ids, turn_kind, f1, format_ok, group_size, cfg.silver_f1)
    turn_cols = turn_column_masks(turn_start, turn_end, adv.shape[1]) & mask.unsqueeze(1)

    stats: dict[str, float] = {}
    if cfg.softpenalty_first:
        adv = soft_penalty(adv, rollout_advantage, scores, turn_cols, turn_kind, group_size, cfg)
    if cfg.rebalance != "none":
        adv, stats = rebalance(adv, _rebalance_scope(cfg.rebalance, turn_kind, turn_start, turn_end, turn_cols, mask),
                               group_size, cfg)
    if not cfg.softpenalty_first:
        adv = soft_penalty(adv, rollout_advantage, scores, turn_cols, turn_kind, group_size, cfg)
    stats.update(_score_stats(scores, turn_kind, rollout_advantage))
    return adv, stats


def _rebalance_scope(scope: str, turn_kind: torch.Tensor, turn_start: torch.Tensor, turn_end: torch.Tensor,
                     turn_cols: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if scope == "response":
        return mask
    last = answer_turn_index(turn_kind, turn_start, turn_end)
    pick = torch.nn.functional.one_hot(last.clamp_min(0), turn_kind.shape[1]).bool() & (last >= 0).unsqueeze(-1)
    return (turn_cols & pick.unsqueeze(-1)).any(1)


def _score_stats(scores: torch.Tensor, turn_kind: torch.Tensor, rollout_adv: torch.Tensor) -> dict[str, float]:
    search = turn_kind == KIND_SEARCH
    neg_search = search & (rollout_adv < 0).unsqueeze(-1)
    return {
        "calibadv/mean_turn_score": float(scores[search].mean()) if bool(search.any()) else 0.0,
        "calibadv/softened_turn_share": float((scores[neg_search] > 0).to(torch.float32).mean())
        if bool(neg_search.any()) else 0.0,
    }


def _validate(advantages, turn_kind, turn_start, turn_end, doc_ids, f1, format_ok, group_size, action_mask) -> None:
    if advantages.dim() != 2:
        raise ValueError(f"CalibAdv: advantages must be [B, A], got shape {tuple(advantages.shape)}")
    b = advantages.shape[0]
    if not isinstance(group_size, int) or group_size < 1 or b % group_size:
        raise ValueError(f"CalibAdv: batch of {b} rows is not a multiple of group_size={group_size!r}")
    for name, t in (("turn_kind", turn_kind), ("turn_start", turn_start), ("turn_end", turn_end)):
        if t.dim() != 2 or t.shape[0] != b or t.shape != turn_kind.shape:
            raise ValueError(f"CalibAdv: {name} must be [B={b}, T], got shape {tuple(t.shape)}")
    if doc_ids.dim() != 3 or doc_ids.shape[:2] != turn_kind.shape:
        raise ValueError(f"CalibAdv: doc_ids must be [B, T, D] with [B, T]={tuple(turn_kind.shape)}, "
                         f"got shape {tuple(doc_ids.shape)}")
    for name, t in (("f1", f1), ("format_ok", format_ok)):
        if t.shape != (b,):
            raise ValueError(f"CalibAdv: {name} must be [B={b}], got shape {tuple(t.shape)}")
    if action_mask is not None and action_mask.shape != advantages.shape:
        raise ValueError(f"CalibAdv: action_mask shape {tuple(action_mask.shape)} != advantages shape "
                         f"{tuple(advantages.shape)}")
