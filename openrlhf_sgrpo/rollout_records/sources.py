"""Group records from what each runner holds: local ``Sample`` lists and OpenRLHF experiences.

Both adapters reduce their input to prompt-contiguous :class:`~.build.Trajectory` lists for the
groups to record and call :func:`build_groups`, which adds what the records need beyond one
sample: the stratum (the estimator's own :func:`~openrlhf_sgrpo.strata.strata_from_info`), the
stratum term and group term of the advantage (SAN and GN for Stratified GRPO), and CalibAdv's
turn scores when it is on. Every statistic is a per-prompt one, so computing it on the recorded
groups alone is exact: dumping N groups costs N groups' work, not the batch's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agent_env.rewards import parse_golds
from openrlhf_sgrpo.advantages import STRATIFIED_ESTIMATORS, compute_stratified
from openrlhf_sgrpo.calibadv import CalibAdvConfig, turn_scores
from openrlhf_sgrpo.openrlhf_ext.turn_info import turn_tensors
from openrlhf_sgrpo.rollout_records.build import RecordLimits, Trajectory, finite, group_record, sample_record
from openrlhf_sgrpo.strata import DEFAULT_STRATIFY_BY, parse_strata_spec, strata_from_info


def advantage_terms(estimator: str, alpha: float) -> tuple[str, float, bool]:
    """(estimator whose stratum/group terms are recorded, its blend alpha, whether it trained).

    ``grpo`` (local runner) is Stratified GRPO at alpha 0. For an upstream estimator
    (group_norm, ...) the recorded terms are Stratified GRPO's SAN and GN, a diagnostic beside
    what trained.
    """
    if estimator == "grpo":
        return "stratified_grpo", 0.0, True
    if estimator in STRATIFIED_ESTIMATORS:
        return estimator, float(alpha), True
    return "stratified_grpo", float(alpha), False


def prompt_digest(question: str) -> str:
    """A stable id for a prompt that came without one (the cluster's datasets)."""
    return hashlib.blake2b(question.encode("utf-8"), digest_size=6).hexdigest()


def stratum_labels(info_rows: Sequence[Mapping[str, float]], keys: tuple[str, ...], cap: int | None) -> list[str]:
    """'tool_calls=2' (or 'search_calls=1, code_calls=0'; 'tool_calls>=3' when capped)."""
    def one(row):
        parts = []
        for key in keys:
            count = int(row[key])
            parts.append(f"{key}>={cap}" if cap is not None and count >= cap else f"{key}={count}")
        return ", ".join(parts)
    return [one(row) for row in info_rows]


def select_groups(num_groups: int, max_groups: int | None) -> list[int]:
    """The first ``max_groups`` prompt groups (all when None): prompts arrive shuffled already."""
    if max_groups is not None and max_groups < 0:
        raise ValueError(f"max_groups must be >= 0 or None, got {max_groups!r}")
    return list(range(num_groups if max_groups is None else min(num_groups, max_groups)))


def _column(rows: Sequence[Mapping[str, float]], key: str) -> torch.Tensor:
    """One info key across rows; integers stay int64 (hashed doc ids need all 63 bits)."""
    values = [r[key] for r in rows]
    exact = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    return torch.tensor(values, dtype=torch.int64 if exact else torch.float64)


def _calib_scores(trajs: list[Trajectory], n: int, cfg: CalibAdvConfig) -> list[list[float]]:
    """CalibAdv's per-turn score s_t (share of new silver docs), as the estimator computes it."""
    keys = trajs[0].info.keys()
    t = turn_tensors({k: _column([tr.info for tr in trajs], k) for k in keys})
    scores = turn_scores(t["doc_ids"], t["turn_kind"], t["f1"], t["format_ok"], n, config=cfg,
                         think_sim=t["think_sim"])
    return scores.tolist()


def _require_config(n: int, adv_cfg: Any) -> None:
    if n >= 2 and adv_cfg is None:
        raise ValueError(f"groups of n={n} need the run's advantage config (adv_cfg) for their advantage terms")


def build_groups(trajs: list[Trajectory], questions: list[str], labels: list, tokenizer, n: int, *, phase: str,
                 step: int, group_ids: list[int], adv_cfg: Any = None, calibadv: CalibAdvConfig | None = None,
                 advantages: Sequence[float] | None = None, prompt_ids: list[str] | None = None,
                 dataset: str | None = None, limits: RecordLimits = RecordLimits(),
                 strata: Sequence[int] | None = None) -> list[dict]:
    """Group records for prompt-contiguous trajectories (``n`` per prompt, one question/label each).

    ``adv_cfg`` is the run's advantage setting, any object with ``estimator, alpha, eps, std,
    stratify_by, strata_cap`` (the local ``AdvantageConfig``, the cluster's ``SGRPOOptions``);
    groups of ``n >= 2`` need it. ``advantages`` are the per-sample scalars the run trained with;
    without them our estimators' blend is recomputed (an upstream estimator's stays None). With
    ``n == 1`` (evaluation) there is no group baseline: every advantage field is None and
    ``adv_cfg`` only chooses the strata (default: tool_calls). CalibAdv turn scores are recorded
    when ``calibadv`` (or ``adv_cfg.calibadv``) is set.

    ``strata`` are the estimator's own ids of these trajectories. A random ``stratify_by``
    (random:KEYS, random_k:K) cannot be redrawn here, so without them its records carry the
    structural strata and no stratum/group terms (None) rather than terms of the wrong strata.
    """
    if n < 1 or len(trajs) != n * len(group_ids):
        raise ValueError(f"{len(trajs)} trajectories for {len(group_ids)} groups of n={n}")
    _require_config(n, adv_cfg)
    spec_text = getattr(adv_cfg, "stratify_by", DEFAULT_STRATIFY_BY)
    spec = parse_strata_spec(spec_text)
    keys = spec.structural_keys
    cap = getattr(adv_cfg, "strata_cap", None)
    calibadv = calibadv if calibadv is not None else getattr(adv_cfg, "calibadv", None)
    infos = [t.info for t in trajs]
    if strata is not None:
        strata = torch.as_tensor(list(strata), dtype=torch.int64)
    elif not spec.is_random:
        strata = strata_from_info({k: _column(infos, k) for k in keys}, keys, cap=cap)
    names = stratum_labels(infos, keys, cap)
    meta: dict = {"stratify_by": spec_text if spec.is_random else ",".join(keys)}
    san = gn = blend = None
    if strata is None:  # random strata not passed in: record the structural ids, no terms
        strata = strata_from_info({k: _column(infos, k) for k in keys}, keys, cap=cap)
        if advantages is not None:
            blend = [float(a) for a in advantages]
    elif n >= 2 and trajs:
        est, alpha, trained = advantage_terms(adv_cfg.estimator, adv_cfg.alpha)
        rewards = torch.tensor([float(t.reward) for t in trajs], dtype=torch.float32)
        san = compute_stratified(est, rewards, strata, n, 1.0, adv_cfg.eps, adv_cfg.std).tolist()
        gn = compute_stratified(est, rewards, strata, n, 0.0, adv_cfg.eps, adv_cfg.std).tolist()
        if advantages is not None:
            blend = [float(a) for a in advantages]
        elif trained:
            blend = [alpha * s + (1 - alpha) * g for s, g in zip(san, gn)]
        meta.update(estimator=adv_cfg.estimator, alpha=finite(alpha), terms=est)
    calib = _calib_scores(trajs, n, calibadv) if calibadv is not None and trajs else None
    out = []
    for j, g in enumerate(group_ids):
        rows = range(j * n, (j + 1) * n)
        samples = [sample_record(trajs[i], tokenizer, i - j * n, int(strata[i]), names[i],
                                 advantage=blend[i] if blend else None, san=san[i] if san else None,
                                 gn=gn[i] if gn else None, limits=limits,
                                 calib_scores=calib[i] if calib else None) for i in rows]
        question = questions[j]
        out.append(group_record(phase=phase, step=step, group=g,
                                prompt_id=prompt_ids[j] if prompt_ids else prompt_digest(question),
                                question=question, golds=parse_golds(labels[j]), samples=samples, meta=meta,
                                dataset=dataset, limits=limits))
    return out


def records_from_samples(samples: list, tokenizer, n_samples: int, *, phase: str, step: int,
                         adv_cfg: Any = None, advantages: Sequence[float] | None = None,
                         token_advantages: Sequence[Sequence[float] | None] | None = None,
                         sapo: Sequence[Mapping[str, float] | None] | None = None,
                         prompt_ids: list[str] | None = None, dataset: str | None = None,
                         max_groups: int | None = None, limits: RecordLimits = RecordLimits(),
                         group_offset: int = 0, strata: Sequence[int] | None = None) -> list[dict]:
    """Records of the single-machine runner's prompt-contiguous ``Sample`` list (local/experience.py).

    ``adv_cfg`` is the trainer's ``AdvantageConfig`` (None for evaluation). Per-sample inputs
    (``advantages``, ``token_advantages``, ``sapo``) follow ``samples``; ``prompt_ids`` has one
    id per prompt group (default: a digest of the question). A record's ``group`` is its prompt's
    index in ``samples`` plus ``group_offset`` (an evaluation records one question at a time, as
    it finishes, and passes the question's position in its dataset). ``strata`` are the
    estimator's ids of ``samples`` (needed for random strata, see :func:`build_groups`).
    """
    if n_samples < 1 or len(samples) % n_samples:
        raise ValueError(f"{len(samples)} samples is not a multiple of n_samples={n_samples}")
    _require_config(n_samples, adv_cfg)
    groups = select_groups(len(samples) // n_samples, max_groups)
    rows = [i for g in groups for i in range(g * n_samples, (g + 1) * n_samples)]
    trajs = [Trajectory(samples[i].sequences.tolist(), samples[i].info, samples[i].reward, samples[i].score,
                        samples[i].truncated,
                        _as_list(token_advantages[i]) if token_advantages is not None else None,
                        sapo[i] if sapo is not None else None) for i in rows]
    first = [samples[g * n_samples] for g in groups]
    return build_groups(trajs, [s.prompt for s in first], [s.label for s in first], tokenizer, n_samples,
                        phase=phase, step=step, adv_cfg=adv_cfg, group_ids=[group_offset + g for g in groups],
                        advantages=[float(advantages[i]) for i in rows] if advantages is not None else None,
                        prompt_ids=[prompt_ids[g] for g in groups] if prompt_ids else None, dataset=dataset,
                        limits=limits, strata=[int(strata[i]) for i in rows] if strata is not None else None)


def _as_list(values) -> list[float] | None:
    if values is None:
        return None
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _info_lists(e) -> dict[str, list[float]]:
    """An experience's per-sample info entries as plain lists (one conversion per experience)."""
    b = len(e.sequences)
    return {key: value.reshape(b, -1)[:, 0].tolist() for key, value in e.info.items()
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == b}


def _row(e, r: int, info_lists: dict[str, list[float]]) -> Trajectory:
    """Row ``r`` of a (right-padded) OpenRLHF Experience as a Trajectory."""
    length = int(e.attention_mask[r].sum()) if e.attention_mask is not None else e.sequences.shape[1]
    info = {key: values[r] for key, values in info_lists.items()}  # ints stay ints (doc ids)
    token_adv = e.advantages[r, : max(length - 1, 0)].tolist() if e.advantages is not None else None
    return Trajectory(e.sequences[r, :length].tolist(), info,
                      float(e.rewards[r]) if e.rewards is not None else float(info.get("reward", 0.0)),
                      float(e.scores[r]) if e.scores is not None else None,
                      bool(e.truncated[r]) if e.truncated is not None else False, token_adv)


def records_from_experiences(experiences: list, tokenizer, n_samples: int, *, step: int, adv_cfg: Any,
                             calibadv: CalibAdvConfig | None = None, max_groups: int | None = None,
                             advantage_key: str | None = None, phase: str = "train",
                             limits: RecordLimits = RecordLimits()) -> list[dict]:
    """Records of the first ``max_groups`` prompt groups of one step's OpenRLHF experiences.

    ``adv_cfg`` is ``sgrpo_options(args)``; ``calibadv`` is ``calibadv_config_from_args(args)``.
    Rows are put in prompt order through ``experience.index`` (as the experience maker does).
    Only the recorded groups' rows are read and decoded. ``advantage_key`` names the info entry
    holding the per-sample scalar advantage (the experience maker's ``ADVANTAGE_INFO_KEY``);
    ``experience.advantages`` (token level, after CalibAdv) gives each turn's mean advantage.
    """
    total = sum(len(e.sequences) for e in experiences)
    if n_samples < 1 or total % n_samples:
        raise ValueError(f"{total} samples is not a multiple of n_samples={n_samples}")
    _require_config(n_samples, adv_cfg)
    groups = select_groups(total // n_samples, max_groups)
    wanted = set(groups)
    where: dict[int, tuple] = {}
    position = 0
    for e in experiences:
        for r in range(len(e.sequences)):
            idx = e.index[r] if e.index is not None else position
            position += 1
            if idx // n_samples in wanted:
                where[idx] = (e, r)
    rows = [where[i] for g in groups for i in range(g * n_samples, (g + 1) * n_samples)]
    infos: dict[int, dict[str, list[float]]] = {}
    for e, _ in rows:
        if id(e) not in infos:
            infos[id(e)] = _info_lists(e)
    trajs = [_row(e, r, infos[id(e)]) for e, r in rows]
    advantages = None
    if advantage_key is not None and all(advantage_key in infos[id(e)] for e, _ in rows):
        advantages = [infos[id(e)][advantage_key][r] for e, r in rows]
    first = rows[::n_samples]
    return build_groups(trajs, [e.prompts[r] for e, r in first], [e.labels[r] for e, r in first], tokenizer,
                        n_samples, phase=phase, step=step, adv_cfg=adv_cfg, calibadv=calibadv, group_ids=groups,
                        advantages=advantages, limits=limits)
