"""The trap regime of the generated task (``--task trap``): one search pays reliably, two searches
have the higher ceiling but fail more at first.

Why a second regime: on the default task (``search``: search-necessary) a two-hop question cannot
be answered with one search, so any two-search sample that succeeds beats every one-search one
and GRPO's global baseline pushes toward two searches as hard as anything can; both estimators
must win there. The paper's claim (Stratified GRPO, arXiv:2510.06214) is about another regime:
a global baseline compares failing two-search samples with paying one-search ones and pushes
*away* from searching more, so GRPO stagnates near one search while Stratified GRPO, which
compares samples inside each search count, keeps improving the two-search samples and goes on
to search more. This world builds that regime on the same names, passages and questions:

- **A shortcut that pays half of the time.** Each person's passage also says who their aunt is
  ("... aunt Tamsin Drell is a mayor") and which river they grew up by. For exactly half of the
  people (:data:`SHORTCUT_RIGHT`) the aunt is the mayor of their birth town and the river is its
  river; for the others they belong to another town of the same side. Nothing in the text tells
  the two halves apart, so a one-search answer to a two-hop question scores EM 1 on about half
  of the people, however well the policy reads.
- **A wrong bridge.** The passage also names a second town, where the person works. A second
  search of that town (a poor second query, copying the wrong town) reads another town's mayor
  or river: EM 0. The right second query (the birth town) answers every time.
- **An agent whose second query is poor at first.** The warm-up's expert (:func:`expert_script`)
  answers two-hop questions with one search and the shortcut in :data:`ONE_SEARCH_SHARE` of its
  demonstrations, and with two searches in the rest, of which only :data:`GOOD_BRIDGE_SHARE` take
  the birth town. The one-search plan names what it will read ("One search: X, then the aunt."),
  so that it does not read like a one-hop question's "One search: X." (whose answer is the birth
  town: a 135M policy whose plans were the same answered the town). After the warm-up the
  one-search stratum should pay more than the two-search one: the demo measures both on held-out
  questions by sampling (``--strata-check``), so a reader sees whether the trap is there before RL
  starts.

RL trains on the two-hop questions only (:func:`rl_questions`): the one-search/two-search
decision is the whole trap, and on a CPU a step holds 4 prompts, which one-hop prompts (all one
search, all paid) would halve. The warm-up and the held-out set keep both hop counts. Held-out
people's aunts, rivers and second towns come from the held-out side, so nothing held-out reaches
training, as on the default task.
"""

from __future__ import annotations

import hashlib
import random

from openrlhf_sgrpo.demo.synth_task import Hop, Pair, TaskQuestion

# One-hop questions about towns only: "In which town was X born?" names a person, as every two-hop
# question does ("... the town where X was born?"), and a 135M policy warmed up on both answered
# two-hop questions with the birth town (held-out greedy, 15 of 16 one-search answers).
TRAP_ONE_HOP = ("mayor", "river")
SHORTCUT_RIGHT = 0.5  # share of people whose aunt / river is their birth town's (the one-search payoff)
ONE_SEARCH_SHARE = 0.5  # of the warm-up's two-hop demonstrations, those that answer after one search
GOOD_BRIDGE_SHARE = 0.2  # of its two-search demonstrations, those whose second query is the birth town


def with_trap_facts(pairs: list[Pair], rng: random.Random) -> list[Pair]:
    """``pairs`` (one side: train or held-out) with a second town, an aunt and a river each:
    exactly ``round(SHORTCUT_RIGHT * n)`` people get their birth town's mayor and river, the
    others those of another pair of the side, never of the town they work in (so the shortcut and
    the wrong bridge fail independently). Needs >= 3 pairs (a town of one's own, one to work in,
    one to mislead)."""
    from dataclasses import replace

    n = len(pairs)
    if n < 3:
        raise ValueError(f"the trap regime needs >= 3 pairs per side, got {n}")
    right = set(rng.sample(range(n), round(SHORTCUT_RIGHT * n)))
    out = []
    for i, p in enumerate(pairs):
        work = (i + 1 + rng.randrange(n - 1)) % n  # any pair but i
        other = rng.choice([j for j in range(n) if j not in (i, work)])
        src = p if i in right else pairs[other]
        out.append(replace(p, works_in=pairs[work].town, aunt=src.mayor, grew_up_by=src.river))
    return out


def attach_trap_hops(q: TaskQuestion, pair: Pair, by_town: dict[str, Pair]) -> TaskQuestion:
    """A two-hop question of a trap pair with its ``shortcut`` (the answer the person's passage
    offers, and the sentence saying it) and ``decoy`` (the hop a second search of the wrong town
    makes); one-hop questions are returned as they are."""
    from dataclasses import replace

    if q.n_hops != 2 or not pair.trap:
        return q
    attribute = q.kind.split("_")[0]  # mayor | river
    if attribute == "mayor":
        shortcut = Hop(pair.person, pair.person, pair.aunt, f"{pair.person}'s aunt {pair.aunt} is a mayor.")
    else:
        shortcut = Hop(pair.person, pair.person, pair.grew_up_by,
                       f"{pair.person} grew up by the {pair.grew_up_by} river.")
    work = by_town[pair.works_in]
    answer, fact = work.fact(attribute)
    return replace(q, shortcut=shortcut, decoy=Hop(work.town, work.town, answer, fact))


def rl_questions(questions: list[TaskQuestion]) -> list[TaskQuestion]:
    """What RL trains on in the trap regime: the two-hop questions (module docstring)."""
    return [q for q in questions if q.n_hops == 2]


def _draw(qid: str, what: str) -> float:
    """A uniform number in [0, 1) fixed by the question and what it decides (no global RNG: the
    same question gets the same demonstration on every machine and in every run)."""
    digest = hashlib.sha256(f"sgrpo-trap-expert/{what}/{qid}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


def expert_plan(q: TaskQuestion) -> str:
    """The imperfect expert's move on ``q``: ``one_search`` (the shortcut), ``good_bridge`` or
    ``wrong_bridge`` (two searches); one-hop and search-necessary questions are ``one_search`` /
    ``good_bridge`` by their hop count."""
    if q.shortcut is None or q.decoy is None:
        return "one_search" if q.n_hops == 1 else "good_bridge"
    if _draw(q.qid, "searches") < ONE_SEARCH_SHARE:
        return "one_search"
    return "good_bridge" if _draw(q.qid, "bridge") < GOOD_BRIDGE_SHARE else "wrong_bridge"


def expert_script(q: TaskQuestion) -> tuple[list[str], str]:
    """The warm-up's demonstration of ``q`` and the answer it ends with (which the
    demonstration's EM is checked against: the shortcut is right for half of the people, the
    wrong bridge almost never). Questions without trap hops (one-hop, or the default world's) get
    the default expert's turns and their gold answer."""
    from openrlhf_sgrpo.demo.synth_task import expert_turns

    plan = expert_plan(q)
    if q.shortcut is None or plan == "good_bridge":
        return expert_turns(q), q.answer
    first = q.hops[0]
    if plan == "one_search":  # the plan names what it will read, unlike a one-hop question's "One search: X."
        what = "the aunt" if q.kind.startswith("mayor") else "the river"
        turns = [f"<think> One search: {first.query}, then {what}. </think>\n<search> {first.query} </search>",
                 f"<think> {q.shortcut.fact} </think>\n<answer> {q.shortcut.answer} </answer>"]
        return turns, q.shortcut.answer
    person, town = first.query, q.decoy.query
    turns = [f"<think> Two searches: first {person}, then the town. </think>\n<search> {person} </search>",
             f"<think> {person} works in {town}. Now {town}. </think>\n<search> {town} </search>",
             f"<think> {q.decoy.fact} </think>\n<answer> {q.decoy.answer} </answer>"]
    return turns, q.decoy.answer


def describe_trap(task, n_rl: int) -> str:
    """One line on what the trap world holds (the demo prints it with the data stage)."""
    people = (*task.train_pairs, *task.heldout_pairs)
    right = sum(p.aunt == p.mayor for p in people) / max(1, len(people))
    plans = [expert_plan(q) for q in task.train if q.n_hops == 2]
    share = {k: plans.count(k) / max(1, len(plans)) for k in ("one_search", "good_bridge", "wrong_bridge")}
    return (f"trap regime: the shortcut is right for {right:.0%} of the people; RL trains on the {n_rl} two-hop "
            f"questions; the warm-up expert's two-hop plans: one search {share['one_search']:.0%}, two searches with "
            f"the birth town {share['good_bridge']:.0%}, with the wrong town {share['wrong_bridge']:.0%}")
