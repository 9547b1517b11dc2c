"""The demo's search-necessary QA task: a generated world of made-up people and towns.

Why generated: every answer is a made-up name that exists only in this corpus, so no model's
memory can answer (a closed-book policy scores EM 0 by construction; the demo measures it), and
held-out questions are about people and towns that no training question, answer or warm-up
observation mentions. Real Wikipedia facts (the earlier demo's FanOutQA sub-questions) are
partly in a model's memory: RL then taught SmolLM2 to stop searching.

The world: each *person* (``Velna Orrick``) was born in one *town* (``Quorliss``); each town lies
on one *river* and has one *mayor*. Every name is unique in the world and each person is the one
person born in their town, so every question has exactly one answer and one chain of passages.
Two passages per person-town pair, short enough for a 135M model's context:

    "Velna Orrick"  Velna Orrick is a glassblower who was born in the town of Quorliss.
    "Quorliss"      Quorliss is a town on the Ulvar river. The mayor of Quorliss is Tamsin Drell.

Questions (each hop's natural query is the entity name it looks up, copied from the question or,
for the second hop, from the first observation):

    single-hop  In which town was Velna Orrick born?              search Velna Orrick -> Quorliss
                Who is the mayor of Quorliss?                     search Quorliss -> Tamsin Drell
                Which river flows through Quorliss?               search Quorliss -> Ulvar
    two-hop     Who is the mayor of the town where Velna Orrick was born?
                                        search Velna Orrick -> Quorliss, search Quorliss -> Tamsin Drell
                Which river flows through the town where Velna Orrick was born?  (same bridge)

A two-hop question names only the person; the town's passage never mentions the person, so the
answer is one search further away (the demo's recall check measures how rarely one search
reaches it). Pairs are split into train and held-out *before* questions are made, so held-out
questions use entities the training questions never name; and training (the warm-up's
demonstrations, the RL rollouts) searches a corpus of the training pairs' passages only, while
evaluation searches all of them, so no held-out fact is ever shown to the policy while it learns,
not even as a retrieved distractor. Everything is a pure function of the
seed: the same seed gives the same world, corpus bytes and questions on any machine.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from openrlhf_sgrpo.local.data import Question
from retriever_server.corpora import make_contents

# Syllables chosen to read as names but rarely form an English word or a famous name.
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "th", "qu")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "n", "r", "l", "s", "x", "m", "rn", "nd")
_TOWN_ENDINGS = ("holm", "mere", "wick", "dale", "stead", "moor", "vale", "ridge", "brook", "haven", "garth")
JOBS = ("glassblower", "ferryman", "beekeeper", "cartographer", "weaver", "clockmaker", "brewer", "potter",
        "stonemason", "bookbinder", "shipwright", "herbalist", "locksmith", "tanner", "chandler", "falconer")

PERSON_TEXT = "{person} is a {job} who was born in the town of {town}."
# The trap regime's person passage (demo/trap_task.py): a second town (a wrong bridge) and two
# shortcut facts that answer the two-hop kinds in one search, right for half of the people.
TRAP_PERSON_TEXT = ("{person} is a {job} who was born in the town of {town} and works in {works_in}. "
                    "{person}'s aunt {aunt} is a mayor, and {person} grew up by the {grew_up_by} river.")
TOWN_TEXT = "{town} is a town on the {river} river. The mayor of {town} is {mayor}."

# (kind, question template, hops): hops name the lookups in order; the last one's fact is the answer.
KINDS = {
    "born": ("In which town was {person} born?", ("person",)),
    "mayor": ("Who is the mayor of {town}?", ("town",)),
    "river": ("Which river flows through {town}?", ("town",)),
    "mayor_of_birthplace": ("Who is the mayor of the town where {person} was born?", ("person", "town")),
    "river_of_birthplace": ("Which river flows through the town where {person} was born?", ("person", "town")),
}
ONE_HOP = ("born", "mayor", "river")
TWO_HOP = ("mayor_of_birthplace", "river_of_birthplace")


@dataclass(frozen=True)
class Pair:
    """One person, the town they were born in, and that town's river and mayor."""

    person: str
    job: str
    town: str
    river: str
    mayor: str
    # the trap regime's facts (demo/trap_task.py); empty in the search-necessary world
    works_in: str = ""  # another town of the same side: the wrong bridge a poor second query takes
    aunt: str = ""  # a mayor: of ``town`` for half of the people (the shortcut pays), else of another town
    grew_up_by: str = ""  # a river: ``town``'s for half of the people, else another town's

    @property
    def trap(self) -> bool:
        return bool(self.works_in)

    def passage(self, entity: str) -> tuple[str, str]:
        """(title, text) of this pair's ``person`` or ``town`` passage."""
        if entity == "person":
            if self.trap:
                return self.person, TRAP_PERSON_TEXT.format(person=self.person, job=self.job, town=self.town,
                                                            works_in=self.works_in, aunt=self.aunt,
                                                            grew_up_by=self.grew_up_by)
            return self.person, PERSON_TEXT.format(person=self.person, job=self.job, town=self.town)
        return self.town, TOWN_TEXT.format(town=self.town, river=self.river, mayor=self.mayor)

    def fact(self, kind: str) -> tuple[str, str]:
        """(answer, one sentence stating it) for a one-hop lookup ``kind``."""
        if kind == "born":
            return self.town, f"{self.person} was born in {self.town}."
        if kind == "mayor":
            return self.mayor, f"The mayor of {self.town} is {self.mayor}."
        if kind == "river":
            return self.river, f"{self.town} is on the {self.river} river."
        raise ValueError(f"unknown fact kind {kind!r}")


@dataclass(frozen=True)
class Hop:
    """One search of the gold chain: its natural query, the passage holding the fact, the fact."""

    query: str
    title: str
    answer: str
    fact: str


@dataclass(frozen=True)
class TaskQuestion:
    qid: str
    question: str
    answer: str
    kind: str
    hops: tuple[Hop, ...]
    # the trap regime's two-hop questions (demo/trap_task.py): the one-search answer the person's
    # passage offers (right for half of the people) and the wrong bridge's hop
    shortcut: Hop | None = None
    decoy: Hop | None = None

    @property
    def n_hops(self) -> int:
        return len(self.hops)

    def as_question(self) -> Question:
        return Question(self.qid, self.question, [self.answer])


@dataclass(frozen=True)
class SynthTask:
    """The generated world: passages (title, text), train and held-out questions."""

    seed: int
    passages: tuple[tuple[str, str], ...]
    train: tuple[TaskQuestion, ...]
    heldout: tuple[TaskQuestion, ...]
    train_pairs: tuple[Pair, ...]
    heldout_pairs: tuple[Pair, ...]
    regime: str = "search"  # REGIMES

    def hops_by_id(self) -> dict[str, int]:
        return {q.qid: q.n_hops for q in (*self.train, *self.heldout)}

    def train_passages(self) -> tuple[tuple[str, str], ...]:
        """The passages of the training pairs only: the corpus training searches (see module doc)."""
        titles = {t for p in self.train_pairs for t in (p.person, p.town)}
        return tuple(p for p in self.passages if p[0] in titles)


def hop_of_qid(qid: str) -> int | None:
    """The hop count a question id carries (``h1-…``/``h2-…``), None for another dataset's id."""
    head = str(qid).split("-", 1)[0]
    return int(head[1:]) if head in ("h1", "h2") else None


class NameMaker:
    """Unique made-up names: every name (and every word of one) is new to the world."""

    def __init__(self, rng: random.Random):
        self.rng, self.taken, self.words = rng, set(), set()

    def _syllable(self, coda: bool) -> str:
        return self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + (self.rng.choice(_CODAS) if coda else "")

    def _word(self, syllables: int, ending: str = "") -> str:
        for _ in range(1000):
            w = "".join(self._syllable(coda=(i == syllables - 1)) for i in range(syllables)) + ending
            w = w.capitalize()
            if 4 <= len(w) <= 11 and w.lower() not in self.words:
                return w
        raise RuntimeError("name space exhausted")  # cannot happen at the demo's sizes

    def _claim(self, name: str) -> str:
        self.taken.add(name.lower())
        self.words.update(w.lower() for w in name.split())
        return name

    def person(self) -> str:
        return self._claim(f"{self._word(2)} {self._word(2)}")

    def town(self) -> str:
        return self._claim(self._word(1, self.rng.choice(_TOWN_ENDINGS)))

    def river(self) -> str:
        return self._claim(self._word(2))


def make_pairs(n: int, seed: int) -> list[Pair]:
    """``n`` person-town pairs with unique names (pure function of ``seed``)."""
    rng = random.Random(f"sgrpo-synth-{seed}")
    names = NameMaker(rng)
    pairs = []
    for _ in range(n):
        person, town, river, mayor = names.person(), names.town(), names.river(), names.person()
        pairs.append(Pair(person, rng.choice(JOBS), town, river, mayor))
    return pairs


def question_for(pair: Pair, kind: str, qid: str) -> TaskQuestion:
    template, lookups = KINDS[kind]
    hops = []
    for i, entity in enumerate(lookups):
        title, _ = pair.passage(entity)
        fact_kind = "born" if entity == "person" else kind.split("_")[0]
        answer, fact = pair.fact(fact_kind)
        hops.append(Hop(query=title, title=title, answer=answer, fact=fact))
    text = template.format(person=pair.person, town=pair.town)
    return TaskQuestion(f"h{len(hops)}-{qid}", text, hops[-1].answer, kind, tuple(hops))


def expert_turns(q: TaskQuestion) -> list[str]:
    """The warm-up's demonstration of ``q``: a plan, one turn per search, then the answer.

    Every action is led by a short ``<think>`` (Search-R1's format reward asks for one): the
    first states the plan ("One search: X." / "Two searches: first X, then the town."), so the
    decision between one and two searches is made once, next to the question, and the later turns
    follow it; the others restate the fact just read (a copy from the observation) and, before the
    second search, name the bridge entity it will look up."""
    first = q.hops[0].query
    plan = f"One search: {first}." if q.n_hops == 1 else f"Two searches: first {first}, then the town."
    turns = [f"<think> {plan} </think>\n<search> {first} </search>"]
    for prev, hop in zip(q.hops, q.hops[1:]):
        turns.append(f"<think> {prev.fact} Now {hop.query}. </think>\n<search> {hop.query} </search>")
    turns.append(f"<think> {q.hops[-1].fact} </think>\n<answer> {q.answer} </answer>")
    return turns


def entity_names(pairs: tuple[Pair, ...]) -> list[str]:
    """Every name the pairs hold (what must never show up in training of held-out pairs)."""
    return [name for p in pairs for name in (p.person, p.town, p.river, p.mayor)]


REGIMES = ("search", "trap")  # search-necessary (this module) and the trap (demo/trap_task.py)


def build_task(n_train_pairs: int = 200, n_heldout: int = 48, seed: int = 0, regime: str = "search") -> SynthTask:
    """The world, its corpus and its questions.

    Train: two questions per pair, one single-hop and one two-hop (kinds in rotation), so half of
    the demonstrations and of the RL prompts need a second search. Held-out: ``n_heldout`` questions, half single-hop and half
    two-hop (the odd one single-hop), each about its own pair, so no two held-out questions share
    an entity or an answer and none shares one with training. ``regime="trap"`` gives every
    person the trap's facts and every two-hop question its shortcut and wrong bridge
    (:mod:`.trap_task`), drawn after the split, each side from its own pairs; the names, the split
    and the questions' wording are the default world's.
    """
    if regime not in REGIMES:
        raise ValueError(f"unknown task regime {regime!r}; choose one of {', '.join(REGIMES)}")
    if n_train_pairs < 1 or n_heldout < 2:
        raise ValueError(f"need n_train_pairs >= 1 and n_heldout >= 2, got {n_train_pairs}, {n_heldout}")
    pairs = make_pairs(n_train_pairs + n_heldout, seed)
    rng = random.Random(f"sgrpo-synth-split-{seed}")
    rng.shuffle(pairs)
    held_pairs, train_pairs = pairs[:n_heldout], pairs[n_heldout:]
    trap_hops = lambda q, p: q  # noqa: E731 - the default world's questions have no trap hops
    if regime == "trap":
        from openrlhf_sgrpo.demo.trap_task import attach_trap_hops, with_trap_facts

        trap_rng = random.Random(f"sgrpo-synth-trap-{seed}")
        held_pairs, train_pairs = with_trap_facts(held_pairs, trap_rng), with_trap_facts(train_pairs, trap_rng)
        by_town = {p.town: p for p in (*held_pairs, *train_pairs)}
        trap_hops = lambda q, p: attach_trap_hops(q, p, by_town)  # noqa: E731
        pairs = held_pairs + train_pairs
    one_hop = ONE_HOP
    if regime == "trap":  # its one-hop questions name a town (demo/trap_task.py: TRAP_ONE_HOP, why)
        from openrlhf_sgrpo.demo.trap_task import TRAP_ONE_HOP as one_hop
    train = []
    for i, p in enumerate(train_pairs):  # one question of each hop count per pair, kinds in rotation
        for kinds in (one_hop, TWO_HOP):
            kind = kinds[i % len(kinds)]
            train.append(trap_hops(question_for(p, kind, f"train{i:04d}-{kind}"), p))
    rng.shuffle(train)
    n_two = n_heldout // 2
    heldout = []
    for i, p in enumerate(held_pairs):
        kinds = TWO_HOP if i < n_two else one_hop
        heldout.append(trap_hops(question_for(p, kinds[i % len(kinds)], f"held{i:03d}"), p))
    passages = [p.passage(e) for p in sorted(pairs, key=lambda p: p.person) for e in ("person", "town")]
    return SynthTask(seed, tuple(passages), tuple(train), tuple(heldout), tuple(train_pairs), tuple(held_pairs),
                     regime)


def write_corpus(task: SynthTask, out_dir: Path, train_only: bool = False) -> Path:
    """Write (or reuse) the task's corpus jsonl (every passage, or the training pairs' only), named
    by its content digest (its index cache key)."""
    passages = task.train_passages() if train_only else task.passages
    rows = [json.dumps({"id": str(i), "contents": make_contents(t, text)}, ensure_ascii=False)
            for i, (t, text) in enumerate(passages)]
    text = "\n".join(rows) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"synth_corpus_{digest}.jsonl"
    if not path.exists():
        tmp = path.with_suffix(f".{random.random():.9f}.part")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return path
