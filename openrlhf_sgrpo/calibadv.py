"""CalibAdv: calibrate token advantages of multi-turn search rollouts (pure torch, vectorized).

"Negative Advantage Is a Double-Edged Sword: Calibrating Advantage in GRPO for Deep Search"
(reference code: github.com/wujwyi/CalibAdv, read, not copied; option names from its
``algorithm.less_negative`` block). A rollout with a wrong final answer (A < 0) often made *good*
searches on the way; a plain group estimator punishes those turns as hard as the wrong answer.
By default CalibAdv does what the authors' code does (docs/sapo_calibadv.md has the rule table):

1. the group's **silver docs** are the documents retrieved by its rollouts at the group's best
   F1 among the well-formatted ones, if that best is >= ``silver_f1`` (ties pool their docs);
2. only well-formatted rollouts are scored; a search turn's score ``s_t`` is the share of its
   documents that are silver *and* not retrieved earlier by the same rollout, and it is 0 when
   the turn's ``<think>`` is more than ``think_similarity`` alike to an earlier search turn's, or
   when it shares ``shared_docs`` or more documents with one earlier search turn;
3. negative rollouts are softened turn by turn: the tokens of turn t get ``A * (1 - s_t)``;
4. then (``softpenalty_first``) the answer segment is rebalanced per group so that
   ``sum |negative| = target_ratio * sum positive`` (default 1: equal mass), by scaling the
   positives (``adjust="positive"``) or the negatives; a group whose answer tokens are all
   positive or all negative gets 0 there.

The project's earlier rules stay available as options (``silver_from="all_good"``,
``scored_rollouts="all"``, ``think_similarity=None``, ``shared_docs=None``,
``softpenalty_first=False``).

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
# Which good rollouts supply silver docs: those at the group's best F1 (authors), or every one.
SILVER_SOURCES: tuple[str, ...] = ("best", "all_good")
# Which rollouts get turn scores: well-formatted ones (authors), or every one.
SCORED_ROLLOUTS: tuple[str, ...] = ("format_ok", "all")
DEFAULT_SILVER_F1 = 0.7
DEFAULT_TARGET_RATIO = 1.0
DEFAULT_THINK_SIMILARITY = 0.5  # a turn whose think is MORE than this alike to an earlier one scores 0
DEFAULT_SHARED_DOCS = 2  # a turn sharing AT LEAST this many docs with one earlier turn scores 0


@dataclass(frozen=True)
class CalibAdvConfig:
    """CalibAdv options; defaults are the authors' code, names follow its ``less_negative`` switches."""

    silver_f1: float = DEFAULT_SILVER_F1  # F1 the best formatted rollout needs for its docs to be silver
    silver_from: str = "best"  # silver sources: rollouts at the group's best F1, or all good ones
    scored_rollouts: str = "format_ok"  # rollouts whose turns are scored (and can be softened)
    think_similarity: float | None = DEFAULT_THINK_SIMILARITY  # None: repeated reasoning still scores
    shared_docs: int | None = DEFAULT_SHARED_DOCS  # None: only individually repeated docs stop counting
    target_ratio: float = DEFAULT_TARGET_RATIO  # sum|neg| / sum pos after rebalancing
    adjust: str = "positive"  # which side the rebalancing rescales
    rebalance: str = "answer"  # segment rebalanced per group: answer, the whole response, or none
    only_apply_risky: bool = False  # rebalance only groups whose sum|neg|/sum pos exceeds target_ratio
    softpenalty_first: bool = True  # soft-penalize turns before (True, authors) or after rebalancing
    aggressive_threshold: float | None = None  # s_t >= this zeroes the turn instead of scaling it
    positive_upper_limit: bool = False  # A + (max_group A - A) * s_t instead of A * (1 - s_t)
    reset2zero: bool = False  # positive rollouts: 0 on turn t when every scored rollout's s_t is 1

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
    for name, allowed in (("silver_from", SILVER_SOURCES), ("scored_rollouts", SCORED_ROLLOUTS),
                          ("adjust", ADJUST_SIDES), ("rebalance", REBALANCE_SCOPES)):
        if getattr(cfg, name) not in allowed:
            errors.append(f"{prefix}{name} must be one of {allowed}, got {getattr(cfg, name)!r}")
    sim = cfg.think_similarity
    if sim is not None and not (isinstance(sim, (int, float)) and not isinstance(sim, bool)
                                and math.isfinite(sim) and 0.0 <= sim <= 1.0):
        errors.append(f"{prefix}think_similarity must be in [0, 1] or None, got {sim!r}")
    shared = cfg.shared_docs
    if shared is not None and not (isinstance(shared, int) and not isinstance(shared, bool) and shared >= 1):
        errors.append(f"{prefix}shared_docs must be an integer >= 1 or None, got {shared!r}")
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


def silver_sources(f1: torch.Tensor, format_ok: torch.Tensor, group_size: int,
                   silver_f1: float = DEFAULT_SILVER_F1, mode: str = "best") -> torch.Tensor:
    """[B] True for the rollouts whose documents make up their group's silver set.

    ``"best"`` (the authors): among the well-formatted rollouts with F1 >= ``silver_f1``, those at
    the group's highest F1 (ties all count). ``"all_good"``: every one of them.
    """
    good = format_ok.bool() & (f1 >= silver_f1)
    if mode == "all_good":
        return good
    f1 = f1.to(torch.float64)
    best = torch.where(good, f1, torch.full_like(f1, -math.inf)).view(-1, group_size).max(-1).values
    return good & (f1 == best.repeat_interleave(group_size))


def scored_rows(format_ok: torch.Tensor, mode: str = "format_ok") -> torch.Tensor:
    """[B] True for the rollouts whose search turns get a score (only those can be softened)."""
    return format_ok.bool() if mode == "format_ok" else torch.ones_like(format_ok, dtype=torch.bool)


def shared_with_earlier(doc_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B, T] the most distinct documents turn t has in common with any ONE earlier turn."""
    b, t, d = doc_ids.shape
    same_turn = (doc_ids.unsqueeze(-1) == doc_ids.unsqueeze(-2)) & valid.unsqueeze(-2)  # [B, T, D, D]
    earlier_slot = torch.ones(d, d, dtype=torch.bool, device=doc_ids.device).tril(-1)
    distinct = valid & ~(same_turn & earlier_slot).any(-1)  # a doc twice in one turn counts once
    most = torch.zeros(b, t, dtype=torch.long, device=doc_ids.device)
    for u in range(t - 1):  # earlier turn u against every later turn t > u
        hit = ((doc_ids.unsqueeze(-1) == doc_ids[:, u].view(b, 1, 1, d)) & valid[:, u].view(b, 1, 1, d)).any(-1)
        common = (hit & distinct).sum(-1)  # [B, T]
        later = torch.arange(t, device=doc_ids.device) > u
        most = torch.where(later, torch.maximum(most, common), most)
    return most


def turn_scores(doc_ids: torch.Tensor, turn_kind: torch.Tensor, f1: torch.Tensor, format_ok: torch.Tensor,
                group_size: int, *, config: CalibAdvConfig | None = None,
                think_sim: torch.Tensor | None = None) -> torch.Tensor:
    """``s_t`` [B, T]: share of a search turn's docs that are silver and new to the rollout.

    0 for non-search turns, turns without documents, rollouts that are not scored
    (``scored_rollouts``), and turns the two repetition rules catch: a ``think_sim`` above
    ``think_similarity`` or ``shared_docs`` or more documents in common with one earlier turn.
    """
    cfg = config or CalibAdvConfig()
    if cfg.think_similarity is not None and think_sim is None:
        raise ValueError(f"CalibAdv: think_similarity={cfg.think_similarity} needs think_sim [B, T] (the agent's "
                         f"turn{{k}}_think_sim); pass it, or set think_similarity=None")
    b, t, d = doc_ids.shape
    is_search = (turn_kind == KIND_SEARCH)
    valid = (doc_ids != DOC_PAD) & is_search.unsqueeze(-1)
    cid, u = _compact_ids(doc_ids)
    group = torch.arange(b, device=doc_ids.device) // group_size
    # Silver set membership through one sort-based isin on (group, doc) keys.
    keys = group.view(b, 1, 1) * u + cid
    sources = silver_sources(f1, format_ok, group_size, cfg.silver_f1, cfg.silver_from)
    pool_rows = sources.view(b, 1, 1) & valid
    silver = torch.isin(keys, keys[pool_rows]) & valid
    # Unseen earlier: first occurrence of the doc in the rollout (turn-major order); padded
    # slots get a per-position key that cannot collide with a real document.
    row_keys = torch.where(valid, cid, u + torch.arange(t * d, device=doc_ids.device).view(1, t, d))
    first = _first_occurrence(row_keys.reshape(b, t * d)).reshape(b, t, d)
    useful = (silver & first).sum(-1).to(torch.float32)
    n_docs = valid.sum(-1).to(torch.float32)
    keep = (n_docs > 0) & scored_rows(format_ok, cfg.scored_rollouts).view(b, 1)
    if cfg.think_similarity is not None:
        keep &= ~(think_sim > cfg.think_similarity)
    if cfg.shared_docs is not None:
        keep &= shared_with_earlier(doc_ids, valid) < cfg.shared_docs
    return torch.where(keep, useful / n_docs.clamp_min(1), torch.zeros_like(useful))


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
                 cfg: CalibAdvConfig, scored: torch.Tensor | None = None) -> torch.Tensor:
    """Scale (or lift) the search-turn tokens of negative rollouts by their turn score.

    ``scored`` [B] marks the rollouts that have turn scores at all (default: every one); only
    they take part in ``reset2zero``.
    """
    search = turn_kind == KIND_SEARCH
    negative = (rollout_adv < 0).unsqueeze(-1) & search  # [B, T]
    cols = turn_cols.to(advantages.dtype)
    if cfg.positive_upper_limit:
        # the authors' group maximum starts from 0, so it is never below 0
        group_max = rollout_adv.view(-1, group_size).max(-1).values.clamp_min(0).repeat_interleave(group_size)
        lift = (group_max - rollout_adv).unsqueeze(-1) * scores * negative  # [B, T]
        out = advantages + torch.einsum("bt,bta->ba", lift.to(advantages.dtype), cols)
    else:
        keep = 1.0 - scores
        if cfg.aggressive_threshold is not None:
            keep = torch.where(scores >= cfg.aggressive_threshold, torch.zeros_like(keep), keep)
        cut = ((1.0 - keep) * negative).to(advantages.dtype)  # share removed per turn
        out = advantages * (1.0 - torch.einsum("bt,bta->ba", cut, cols))
    if cfg.reset2zero:
        # Mean score over the group's scored rollouts that searched at slot t; == 1 means "every
        # one found only new silver docs there": nothing to learn, so positives get 0 on it.
        counted = search if scored is None else search & scored.bool().unsqueeze(-1)
        s = (scores * counted).view(-1, group_size, scores.shape[1]).sum(1)
        c = counted.view(-1, group_size, scores.shape[1]).sum(1)
        trivial = ((c > 0) & (s >= c - 1e-9)).repeat_interleave(group_size, 0)  # [B, T]
        zero = ((rollout_adv > 0).unsqueeze(-1) & counted & trivial).to(advantages.dtype)
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
    think_sim: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Calibrated token advantages [B, A] and batch stats.

    Shapes: advantages/action_mask [B, A]; turn_kind/turn_start/turn_end [B, T] (advantage
    columns, half-open, -1 padded); doc_ids [B, T, D] (-1 padded); think_sim [B, T] (a search
    turn's highest think similarity to an earlier search turn, -1 where none; needed unless
    ``think_similarity`` is None); f1/format_ok/rollout_advantage [B]. Rows are
    prompt-contiguous, ``group_size`` per prompt. ``rollout_advantage`` decides a rollout's sign
    (default: its masked mean token advantage).
    """
    cfg = config or CalibAdvConfig()
    _validate(advantages, turn_kind, turn_start, turn_end, doc_ids, f1, format_ok, group_size, action_mask,
              think_sim)
    adv = advantages.clone()
    mask = torch.ones_like(adv, dtype=torch.bool) if action_mask is None else action_mask.bool()
    if rollout_advantage is None:
        rollout_advantage = (adv * mask).sum(-1) / mask.sum(-1).clamp_min(1)
    scores = turn_scores(doc_ids, turn_kind, f1, format_ok, group_size, config=cfg, think_sim=think_sim)
    scored = scored_rows(format_ok, cfg.scored_rollouts)
    turn_cols = turn_column_masks(turn_start, turn_end, adv.shape[1]) & mask.unsqueeze(1)

    stats: dict[str, float] = {}
    if cfg.softpenalty_first:
        adv = soft_penalty(adv, rollout_advantage, scores, turn_cols, turn_kind, group_size, cfg, scored)
    if cfg.rebalance != "none":
        adv, stats = rebalance(adv, _rebalance_scope(cfg.rebalance, turn_kind, turn_start, turn_end, turn_cols, mask),
                               group_size, cfg)
    if not cfg.softpenalty_first:
        adv = soft_penalty(adv, rollout_advantage, scores, turn_cols, turn_kind, group_size, cfg, scored)
    stats.update(_score_stats(scores, turn_kind, rollout_advantage))
    stats["calibadv/scored_share"] = float(scored.to(torch.float32).mean())
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


def _validate(advantages, turn_kind, turn_start, turn_end, doc_ids, f1, format_ok, group_size, action_mask,
              think_sim=None) -> None:
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
    if think_sim is not None and think_sim.shape != turn_kind.shape:
        raise ValueError(f"CalibAdv: think_sim must be [B, T]={tuple(turn_kind.shape)}, got shape "
                         f"{tuple(think_sim.shape)}")
    if action_mask is not None and action_mask.shape != advantages.shape:
        raise ValueError(f"CalibAdv: action_mask shape {tuple(action_mask.shape)} != advantages shape "
                         f"{tuple(advantages.shape)}")
