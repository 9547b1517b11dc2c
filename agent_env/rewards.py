"""Answer scoring: EM, sub-EM and token F1 as FlashRAG and Search-R1 compute them, the official GAIA
scorer, and Search-R1's v0.3 format reward.

Everything here is pure string work so the same functions score training rollouts and
evaluation reports. Peers followed (and tested against in tests/test_reward_peers.py):
EM / sub-EM / F1: FlashRAG `flashrag/evaluator/metrics.py` (EM and sub-EM are also Search-R1's
`verl/utils/reward_score/qa_em.py` `em_check` / `subem_check`); GAIA: the leaderboard's
`question_scorer` (as vendored by `inspect-evals`); format reward: Search-R1's `qa_em_format.py`.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_YES_NO = ("yes", "no", "noanswer")

Golds = str | Sequence[str]


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop a/an/the, collapse whitespace (SQuAD/FlashRAG rules)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def gold_list(golds: Golds) -> list[str]:
    """A plain string is one gold answer (never its characters), as in the peers; else each item."""
    return [golds] if isinstance(golds, str) else [str(g) for g in golds]


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


def exact_match(prediction: str, golds: Golds) -> float:
    """1 if the normalized prediction equals some normalized gold answer."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in gold_list(golds)))


def sub_exact_match(prediction: str, golds: Golds) -> float:
    """1 if some normalized gold answer occurs inside the normalized prediction.

    Peer-exact on purpose: a gold that normalizes to the empty string ('!!!', 'The The', 'A+') is
    inside every prediction, so it scores 1 whatever was answered, as in FlashRAG's `Sub_ExactMatch`
    and Search-R1's `subem_check`; our reported sub-EM is then the number they report. (6 of the
    ~31k questions in ../shared/data have such a gold; under group normalization a prompt whose
    samples all score 1 adds no gradient, so training loses nothing by it.)
    """
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(g) in pred for g in gold_list(golds)))


def token_f1(prediction: str, golds: Golds) -> float:
    """Token-level F1 on normalized words, max over gold answers (FlashRAG's `F1_Score`).

    As in FlashRAG and HotpotQA's official evaluation, when the prediction or the gold normalizes
    to yes / no / noanswer and the two differ, that gold scores 0 (no partial credit for
    "yes it is" against "yes").
    """
    pred = normalize_answer(prediction)
    best = 0.0
    for gold in map(normalize_answer, gold_list(golds)):
        if (pred in _YES_NO or gold in _YES_NO) and pred != gold:
            continue
        pred_tokens, gold_tokens = pred.split(), gold.split()
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred_tokens), common / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


# ---------------------------------------------------------------- GAIA
def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _gaia_number(text: str) -> float:
    """The official `normalize_number_str`: drop `$ % ,` and parse; not a number gives inf (sic)."""
    for ch in "$%,":
        text = text.replace(ch, "")
    try:
        return float(text)
    except ValueError:
        return float("inf")


def _gaia_str(text: str, remove_punct: bool = True) -> str:
    """The official `normalize_str`: no whitespace at all, lowercase, optionally no punctuation."""
    text = re.sub(r"\s", "", text).lower()
    return "".join(ch for ch in text if ch not in _PUNCT) if remove_punct else text


def gaia_score(prediction: str, gold: str) -> float:
    """GAIA's official `question_scorer`, quirks included so our accuracy is the leaderboard's.

    Only the prediction is normalized: a gold that `float()` parses as it stands is a number (the
    prediction loses `$ % ,` and must parse to the same float; one that does not parse counts as
    inf, so it matches a gold of "inf"); else a gold holding `,` or `;` is a list, split on both,
    compared element-wise with the same rule per element but strings keeping their punctuation;
    else both are compared as strings without whitespace, case or punctuation. So a gold "$1,000"
    is the list ["$1", "000"] and a gold "12.5%" the string "125".
    """
    if _is_float(gold):
        return float(_gaia_number(prediction) == float(gold))
    if any(sep in gold for sep in ",;"):
        gold_items, pred_items = re.split(r"[,;]", gold), re.split(r"[,;]", prediction)
        if len(gold_items) != len(pred_items):
            return 0.0
        return float(all(_gaia_number(p) == float(g) if _is_float(g)
                         else _gaia_str(p, remove_punct=False) == _gaia_str(g, remove_punct=False)
                         for p, g in zip(pred_items, gold_items)))
    return float(_gaia_str(prediction) == _gaia_str(gold))


def gaia_match(prediction: str, golds: Golds) -> float:
    """Best official GAIA score over the gold answers (GAIA itself has one per task)."""
    return max((gaia_score(prediction, g) for g in gold_list(golds)), default=0.0)


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


def retrieval_hit(response: str, golds: Golds) -> bool:
    """Some gold answer is inside one `<information>` block (Search-R1's `is_retrieval_correct`)."""
    blocks = re.findall(r"<information>(.*?)</information>", response, re.DOTALL)
    return any(sub_exact_match(block, golds) for block in blocks)


@dataclass(frozen=True)
class FormatCoefficients:
    structure_format_score: float = 0.2
    final_format_score: float = 0.1
    retrieval_score: float = 0.0


def format_reward(response: str, answer: str | None, golds: Golds, metric: str = "em",
                  coef: FormatCoefficients = FormatCoefficients()) -> float:
    """Search-R1 v0.3 `compute_score_em` semantics, generalised to any metric in METRICS.

    `response` is the whole trajectory after the prompt (turns and observations); `answer` is the
    final turn's answer as `agent_env.actions.answer_of` reads it (None when it gave none): the
    same answer that EM, F1 and `answered` see, so an `<answer>` the parser does not count (inside
    an unclosed `<think>`, or printed by a tool) earns nothing here either. A correct answer scores
    the metric (minus the structure score when the format is broken); a wrong or missing one earns
    only format credit.
    """
    valid = is_valid_sequence(response)
    score = METRICS[metric](answer, golds) if answer is not None else 0.0
    if answer is not None and score > 0:
        return score if valid else score - coef.structure_format_score
    if valid:
        hit = retrieval_hit(response, golds)
        return coef.structure_format_score + (coef.retrieval_score if hit else 0.0)
    return coef.final_format_score if answer is not None else 0.0
