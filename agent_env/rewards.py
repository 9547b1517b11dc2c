"""Answer scoring: Search-R1/FlashRAG EM, sub-EM and token F1, Search-R1's format reward, GAIA.

Everything here is pure string work so the same functions score training rollouts and
evaluation reports.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from dataclasses import dataclass

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop a/an/the, collapse whitespace (SQuAD/FlashRAG rules)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def parse_golds(label) -> list[str]:
    """The dataset label: a JSON list of gold answers, a JSON string, a plain string or a list."""
    if isinstance(label, (list, tuple)):
        return [str(g) for g in label]
    if isinstance(label, dict):
        for key in ("target", "golden_answers", "answers", "answer"):
            if key in label:
                return parse_golds(label[key])
        raise ValueError(f"label dict has none of target/golden_answers/answers/answer: {sorted(label)}")
    text = str(label)
    stripped = text.strip()
    if stripped[:1] in ('[', '"', '{'):
        try:
            return parse_golds(json.loads(stripped))
        except json.JSONDecodeError:
            pass
    return [text]


def exact_match(prediction: str, golds: list[str]) -> float:
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def sub_exact_match(prediction: str, golds: list[str]) -> float:
    """1 if some normalized gold answer occurs inside the normalized prediction."""
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(g) and normalize_answer(g) in pred for g in golds))


def token_f1(prediction: str, golds: list[str]) -> float:
    """Token-level F1 on normalized words, max over gold answers."""
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        gold_tokens = normalize_answer(gold).split()
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred_tokens), common / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


# ---------------------------------------------------------------- GAIA
def _gaia_number(text: str) -> float | None:
    cleaned = text.strip()
    for ch in "$%,":
        cleaned = cleaned.replace(ch, "")
    try:
        return float(cleaned)
    except ValueError:
        return None


def _gaia_str(text: str, remove_punct: bool = True) -> str:
    text = "".join(text.split()).lower()
    return "".join(ch for ch in text if ch not in _PUNCT) if remove_punct else text


def _gaia_element(pred: str, gold: str) -> bool:
    gold_num = _gaia_number(gold)
    if gold_num is not None:
        pred_num = _gaia_number(pred)
        return pred_num is not None and pred_num == gold_num
    return _gaia_str(pred, remove_punct=False) == _gaia_str(gold, remove_punct=False)


def gaia_score(prediction: str, gold: str) -> float:
    """GAIA's scorer: numbers as floats, `,`/`;` lists element-wise, strings normalized."""
    if _gaia_number(gold) is not None:
        pred_num = _gaia_number(prediction)
        return float(pred_num is not None and pred_num == _gaia_number(gold))
    if any(sep in gold for sep in ",;"):
        gold_items = re.split(r"[,;]", gold)
        pred_items = re.split(r"[,;]", prediction)
        if len(gold_items) != len(pred_items):
            return 0.0
        return float(all(_gaia_element(p, g) for p, g in zip(pred_items, gold_items)))
    return float(_gaia_str(prediction) == _gaia_str(gold))


def gaia_match(prediction: str, golds: list[str]) -> float:
    return max((gaia_score(prediction, g) for g in golds), default=0.0)


METRICS = {"em": exact_match, "sub_em": sub_exact_match, "f1": token_f1, "gaia": gaia_match}


# ---------------------------------------------------------------- format reward (Search-R1 v0.3)
_TAG = re.compile(r"(</?(?:think|search|information|code|result|answer)>)")
# state -> {tag: next state}; states named "in_*" may hold free text.
_TRANSITIONS = {
    "start": {"<think>": "in_think"},
    "in_think": {"</think>": "after_think"},
    "after_think": {"<search>": "in_search", "<code>": "in_code", "<answer>": "in_answer"},
    "in_search": {"</search>": "after_search"},
    "after_search": {"<information>": "in_information"},
    "in_information": {"</information>": "after_observation"},
    "in_code": {"</code>": "after_code"},
    "after_code": {"<result>": "in_result"},
    "in_result": {"</result>": "after_observation"},
    "after_observation": {"<think>": "in_think"},
    "in_answer": {"</answer>": "end"},
    "end": {},
}


def is_valid_sequence(response: str) -> bool:
    """Search-R1's structure check: think → (search → information → think)* → answer, nothing stray."""
    state = "start"
    for piece in _TAG.split(response):
        if not piece:
            continue
        if _TAG.fullmatch(piece):
            nxt = _TRANSITIONS[state].get(piece)
            if nxt is None:
                return False
            state = nxt
        elif piece.strip() and not state.startswith("in_"):
            return False
    return state == "end"


def extract_answer(response: str) -> str | None:
    """Content of the last complete `<answer>` element, or None."""
    found = re.findall(r"<answer>(.*?)</answer>", response, re.DOTALL)
    return found[-1].strip() if found else None


def retrieval_hit(response: str, golds: list[str]) -> bool:
    """Some gold answer appears in an `<information>` block (Search-R1's retrieval score)."""
    blocks = " ".join(re.findall(r"<information>(.*?)</information>", response, re.DOTALL))
    return bool(sub_exact_match(blocks, golds)) if blocks else False


@dataclass(frozen=True)
class FormatCoefficients:
    structure_format_score: float = 0.2
    final_format_score: float = 0.1
    retrieval_score: float = 0.0


def format_reward(response: str, golds: list[str], metric: str = "em",
                  coef: FormatCoefficients = FormatCoefficients()) -> float:
    """Search-R1 v0.3 `compute_score_em` semantics, generalised to any metric in METRICS.

    A correct answer scores the metric (minus the structure score when the format is broken);
    a wrong or missing one earns only format credit.
    """
    valid = is_valid_sequence(response)
    answer = extract_answer(response)
    score = METRICS[metric](answer, golds) if answer is not None else 0.0
    if answer is not None and score > 0:
        return score if valid else score - coef.structure_format_score
    if valid:
        hit = retrieval_hit(response, golds)
        return coef.structure_format_score + (coef.retrieval_score if hit else 0.0)
    return coef.final_format_score if answer is not None else 0.0
