"""Our vectorized CalibAdv against the authors' procedure restated as plain loops, on random groups.

The oracle below restates, in our own words and one rollout at a time, what the authors' code
(github.com/wujwyi/CalibAdv at 6ae1c4e: ``verl/trainer/main_ppo_format.py`` for the turn scores,
``verl/trainer/ppo/core_algos.py`` ``compute_grpo_outcome_softpenalty_advantage`` and
``advantage_scale`` for the penalty and the rebalancing) does with the settings its
``train_grpo.sh`` lists: query score "old", soft penalty first, answer-only in-group rebalancing
of the positives to a 1:1 ratio. It takes the turns' ``<think>`` *texts* and measures their
similarity itself (a memoized recursion, unlike the agent's row-by-row table), so the agent's
measure is checked along with the trainer's rules. The issue that started this (#25) found the
project's earlier code agreeing with these rules in well under half of such groups.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

import pytest
import torch

from agent_env.think import max_similarity, word_edit_distance
from openrlhf_sgrpo.calibadv import CalibAdvConfig, calibadv_token_advantages
from openrlhf_sgrpo.testing import shifted_seed

SEARCH, ANSWER, PAD = 1, 3, -1
GROUP = 5
VOCAB = ("paris", "city", "france", "the", "capital")


@dataclass
class OracleRollout:
    searches: list[tuple[list[int], str]]  # (docs, think text) per search turn, in order
    answered: bool
    f1: float
    format_ok: bool
    adv: float
    tokens: int = 2  # per turn


def _words_distance(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    @lru_cache(maxsize=None)
    def d(i: int, j: int) -> int:
        if i == 0 or j == 0:
            return i + j
        return min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))
    return d(len(a), len(b))


def oracle_similar(x: str, y: str) -> float:
    a, b = tuple(x.split()), tuple(y.split())
    if not a and not b:
        return 0.0
    return 1 - _words_distance(a, b) / max(len(a), len(b))


def oracle_group(group: list[OracleRollout]) -> list[list[float]]:
    """Token advantages of one group, rollout by rollout, as the authors' loops produce them."""
    # silver docs: pooled from the formatted rollouts tied at the best F1, when it reaches 0.7
    eligible = [r for r in group if r.format_ok and r.f1 >= 0.7]
    top = max((r.f1 for r in eligible), default=None)
    silver = {d for r in eligible if r.f1 == top for docs, _ in r.searches for d in docs}
    rows = []
    for r in group:
        scores = [0.0] * len(r.searches)
        if r.format_ok and silver:
            seen: set[int] = set()
            for t, (docs, thought) in enumerate(r.searches):
                new_silver = 0
                for d in docs:
                    new_silver += d in silver and d not in seen
                    seen.add(d)
                repeats_thought = any(oracle_similar(thought, r.searches[u][1]) > 0.5 for u in range(t))
                repeats_docs = any(len(set(docs) & set(r.searches[u][0])) >= 2 for u in range(t))
                if new_silver and not repeats_thought and not repeats_docs:
                    scores[t] = new_silver / len(docs)
        row = []
        for s in scores:
            row += [r.adv * (1 - s) if r.adv < 0 else r.adv] * r.tokens
        row += [r.adv] * (r.tokens if r.answered else 0)
        rows.append(row)
    # rebalance the answer segments (each rollout's last turn): positives scaled to the negatives' mass
    answers = [row[len(row) - r.tokens:] for r, row in zip(group, rows)]
    pos = sum(v for seg in answers for v in seg if v > 0)
    neg = -sum(v for seg in answers for v in seg if v < 0)
    for r, row in zip(group, rows):
        for j in range(len(row) - r.tokens, len(row)):
            if pos == 0 or neg == 0:
                row[j] = 0.0
            elif row[j] > 0:
                row[j] *= neg / pos
    return rows


def random_group(rng: random.Random) -> list[OracleRollout]:
    group = []
    for _ in range(GROUP):
        searches = [([rng.randrange(6) for _ in range(rng.randint(1, 3))],
                      " ".join(rng.choice(VOCAB) for _ in range(rng.randint(0, 4))))
                    for _ in range(rng.randint(0, 3))]
        answered = rng.random() < 0.85 or not searches
        group.append(OracleRollout(searches, answered, rng.choice([0.0, 0.5, 0.7, 0.8, 1.0]),
                                   rng.random() < 0.7, rng.choice([-1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0])))
    return group


def our_inputs(groups: list[list[OracleRollout]]) -> tuple[dict, int]:
    """The same rollouts as our tensors, think similarities measured as the agent measures them."""
    rollouts = [r for g in groups for r in g]
    b, t, d = len(rollouts), 4, 3
    width = max(2 * (len(r.searches) + 1) for r in rollouts)
    kind, start, end = (torch.full((b, t), PAD) for _ in range(3))
    docs, sim = torch.full((b, t, d), PAD), torch.full((b, t), -1.0)
    adv, mask = torch.zeros(b, width), torch.zeros(b, width, dtype=torch.bool)
    for i, r in enumerate(rollouts):
        turns = [(SEARCH, ds, th) for ds, th in r.searches] + ([(ANSWER, [], "")] if r.answered else [])
        for k, (kd, ds, th) in enumerate(turns):
            kind[i, k], start[i, k], end[i, k] = kd, r.tokens * k, r.tokens * (k + 1)
            docs[i, k, : len(ds)] = torch.tensor(ds, dtype=torch.long)
            if kd == SEARCH:
                earlier = max_similarity(th, [x for _, x in r.searches[:k]])
                sim[i, k] = -1.0 if earlier is None else earlier
        n = r.tokens * len(turns)
        adv[i, :n], mask[i, :n] = r.adv, True
    return dict(advantages=adv, turn_kind=kind, turn_start=start, turn_end=end, doc_ids=docs, think_sim=sim,
                f1=torch.tensor([r.f1 for r in rollouts]), format_ok=torch.tensor([r.format_ok for r in rollouts]),
                group_size=GROUP, action_mask=mask), width


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_authors_procedure_on_random_groups(seed):
    rng = random.Random(shifted_seed(seed))
    groups = [random_group(rng) for _ in range(200)]
    inputs, width = our_inputs(groups)
    ours, _ = calibadv_token_advantages(**inputs, config=CalibAdvConfig())
    rows = [row for g in groups for row in oracle_group(g)]
    want = torch.tensor([row + [0.0] * (width - len(row)) for row in rows])
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_agents_bit_parallel_distance_is_the_recurrence(seed):
    """Word lists up to 90 long (past a 64-bit word) over 1 to 8 distinct words."""
    rng = random.Random(shifted_seed(seed))
    for _ in range(300):
        vocab = VOCAB[: rng.randint(1, len(VOCAB))] + ("x", "y", "z")[: rng.randint(0, 3)]
        a = tuple(rng.choice(vocab) for _ in range(rng.randint(0, 90)))
        b = tuple(rng.choice(vocab) for _ in range(rng.randint(0, 90)))
        assert word_edit_distance(a, b) == _words_distance(a, b), (a, b)
