"""Metrics by hop count: what the demo's tables, plots and inspector curves report.

A single-hop question needs one search and a two-hop question two (the second query is the first
answer), so the numbers that tell whether a policy searches *where it must* are split by hop:
EM / F1, searches per question, and on two-hop questions the share of trajectories that searched
twice. Evaluation records (``eval.core.record_of``) carry the question id, whose prefix holds
the hop count (``synth_task.hop_of_qid``); a dataset without it is reported as one "all" row.
"""

from __future__ import annotations

from collections.abc import Callable

from agent_env import info_keys as K
from openrlhf_sgrpo.demo.synth_task import hop_of_qid

HOPS = (1, 2)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def by_hop(rows: list[dict], hop_of: Callable[[dict], int | None]) -> dict[str, float]:
    """Flat metrics of ``rows`` (one dict per trajectory with em, f1, search_calls, answered):
    ``em`` … over all rows, ``hop1/em`` … per hop, ``hop2/two_search_share`` on two-hop rows."""
    out: dict[str, float] = {"n": float(len(rows))}
    groups: dict[str, list[dict]] = {"": rows}
    for h in HOPS:
        picked = [r for r in rows if hop_of(r) == h]
        if picked:
            groups[f"hop{h}/"] = picked
    for prefix, group in groups.items():
        out[f"{prefix}n"] = float(len(group))
        for key in ("em", "f1", "search_calls", "answered"):
            out[f"{prefix}{key}"] = _mean([float(r.get(key) or 0.0) for r in group])
        out[f"{prefix}two_search_share"] = _mean([float(float(r.get("search_calls") or 0) >= 2) for r in group])
    return out


def eval_by_hop(records: list[dict]) -> dict[str, float]:
    """:func:`by_hop` over evaluation records (the hop comes from the question id)."""
    return by_hop(records, lambda r: hop_of_qid(r["id"]))


class HopMetrics:
    """The trainer's rollout, plus per-hop metrics of each step's trajectories in its log record.

    The trainer spreads ``RolloutResult.timing`` into the step record it logs, so the metrics
    ride there (``hop1/em``, ``hop2/two_search_share``, …: metrics.jsonl, TensorBoard, the
    inspector's curves) without a change to the trainer. Everything else is the wrapped rollout.
    """

    def __init__(self, rollout, hop_of_question: dict[str, int]):
        self._rollout, self._hops = rollout, hop_of_question

    def run(self, prompts: list[str], golds: list[list[str]], n: int = 1, **kwargs):
        result = self._rollout.run(prompts, golds, n=n, **kwargs)
        rows = [{"hop": self._hops.get(prompts[i // n]), "em": s.info.get(K.EM, 0.0), "f1": s.info.get(K.F1, 0.0),
                 "search_calls": s.info.get(K.SEARCH_CALLS, 0.0), "answered": s.info.get(K.ANSWERED, 0.0)}
                for i, s in enumerate(result.samples)]
        metrics = by_hop(rows, lambda r: r["hop"])
        result.timing.update({k: v for k, v in metrics.items() if k.startswith("hop")})
        return result

    def __getattr__(self, name):
        return getattr(self._rollout, name)
