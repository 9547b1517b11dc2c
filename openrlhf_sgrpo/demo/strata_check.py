"""The strata's success rates on held-out two-hop questions, measured by sampling.

Why: the study's two regimes differ in what one and two searches pay *before* RL (the trap:
one search ~0.5, two searches less; search-necessary: one search 0). A greedy evaluation takes
one path per question and cannot show that; sampling ``n`` trajectories per held-out two-hop
question at the training temperature, and splitting them by search count, measures each
stratum's share and EM with the policy RL starts from. The run logs it (``phase:
strata_check``) and the study keeps it in each seed folder, so a reader sees whether the trap
was there, seed by seed. Evaluation's retriever (every passage) and never a training update:
nothing held-out reaches the policy's weights.
"""

from __future__ import annotations

import math

from agent_env import info_keys as K

STRATA = ("0", "1", "2", "3plus")


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95 % Wilson score interval of a success share k / n ((nan, nan) for n = 0): unlike the
    normal interval it stays inside [0, 1] and means something at the strata's small counts."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def stratum_of(search_calls: float) -> str:
    k = int(search_calls)
    return str(k) if k < 3 else "3plus"


def summarize(rows: list[tuple[float, float]]) -> dict:
    """``rows``: (search calls, EM) per sampled trajectory -> per stratum ``n``, ``share``, ``em``
    and its Wilson interval ``em_lo`` / ``em_hi``; strata with no trajectory are left out."""
    out: dict = {"n": len(rows), "strata": {}}
    for s in STRATA:
        ems = [em for calls, em in rows if stratum_of(calls) == s]
        if not ems:
            continue
        wins = sum(em >= 1.0 for em in ems)
        lo, hi = wilson(wins, len(ems))
        out["strata"][s] = {"n": len(ems), "share": len(ems) / len(rows), "em": wins / len(ems),
                            "em_lo": lo, "em_hi": hi}
    return out


def measure(rollout, questions: list, n: int, seed: int) -> dict:
    """``n`` sampled trajectories per question (``questions``: the held-out two-hop ones, as
    ``local.data.Question``) with the rollout's temperature, seeded, summarized by stratum."""
    result = rollout.run([q.question for q in questions], [q.golds for q in questions], n=n,
                         desc="strata check", seed=seed)
    rows = [(float(s.info.get(K.SEARCH_CALLS, 0.0)), float(s.info.get(K.EM, 0.0))) for s in result.samples]
    out = summarize(rows)
    out.update(questions=len(questions), samples_per_question=n)
    return out


def describe(check: dict) -> str:
    parts = [f"{s} search{'es' if s != '1' else ''}: share {v['share']:.2f}, EM {v['em']:.2f} "
             f"[{v['em_lo']:.2f}, {v['em_hi']:.2f}] (n {v['n']})" for s, v in check["strata"].items()]
    return (f"strata on held-out two-hop questions ({check['questions']} x {check['samples_per_question']} "
            f"sampled): " + "; ".join(parts))
