"""Our answer metrics against the peers' own, on generated (prediction, golds) pairs and real data.

- FlashRAG's EM / sub-EM / F1: `flashrag.evaluator.metrics` from the `flashrag-dev` wheel (installed
  `--no-deps`: that module needs only the standard library).
- Search-R1's `qa_em.py` (`em_check`, `subem_check`, `is_retrieval_correct`): restated in
  tests/peer_rules.py (Search-R1 is not on PyPI).
- GAIA: the leaderboard's `question_scorer` as `inspect-evals` ships it (tests/peer_rules.py
  compiles just its four functions from the installed file).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from peer_rules import (
    official_gaia_question_scorer,
    search_r1_em,
    search_r1_retrieval_correct,
    search_r1_subem,
)

from agent_env.rewards import exact_match, gaia_score, retrieval_hit, sub_exact_match, token_f1
from openrlhf_sgrpo.assets import shared_data

SETTINGS = settings(max_examples=400, deadline=None)

# Pieces chosen to reach every rule: articles (whole words only), punctuation, case, yes/no/noanswer,
# whitespace of several kinds, non-ASCII letters and digits.
WORDS = ["Paris", "paris", "PARIS", "the", "The", "a", "an", "An", "Theatre", "another", "yes", "Yes", "no",
         "NO", "noanswer", "no answer", "New", "York", "city", "U.S.", "1", "2.5", "!!!", "-", "’", "é",
         "Ünïcode", "A+", "1,000", "$5", "40%", ""]
SEPS = [" ", "  ", "\t", "\n", ", ", ".", "-", "\u00a0", ""]
phrase = st.one_of(
    st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from(SEPS)), max_size=6)
    .map(lambda parts: "".join(w + s for w, s in parts)),
    st.text(max_size=20),
)
golds = st.one_of(phrase, st.lists(phrase, max_size=4))  # a plain string or a list, as the peers accept


@pytest.fixture(scope="module")
def flashrag():
    metrics = pytest.importorskip(
        "flashrag.evaluator.metrics", reason="FlashRAG's metrics: pip install --no-deps flashrag-dev==0.1.2")
    config = {"dataset_name": "nq"}  # any name but curatedtrec (which reads golds as regexes)
    return metrics.ExactMatch(config), metrics.Sub_ExactMatch(config), metrics.F1_Score(config)


@pytest.fixture(scope="module")
def official_gaia():
    scorer = official_gaia_question_scorer()
    if scorer is None:
        pytest.skip("the official GAIA scorer: pip install --no-deps inspect-evals==0.26.0")
    return scorer


def _check_flashrag(flashrag, pred, gold) -> None:
    em, sub_em, f1 = flashrag
    assert exact_match(pred, gold) == em.calculate_em(pred, gold)
    assert sub_exact_match(pred, gold) == sub_em.calculate_sub_em(pred, gold)
    assert token_f1(pred, gold) == pytest.approx(f1.token_level_scores(pred, gold)["f1"], abs=1e-12)


@SETTINGS
@given(pred=phrase, gold=golds)
def test_em_subem_f1_equal_flashrags(flashrag, pred, gold):
    _check_flashrag(flashrag, pred, gold)


@SETTINGS
@given(pred=phrase, gold=golds)
def test_em_subem_equal_search_r1_qa_em(pred, gold):
    assert exact_match(pred, gold) == search_r1_em(pred, gold)
    assert sub_exact_match(pred, gold) == search_r1_subem(pred, gold)


@SETTINGS
@given(blocks=st.lists(phrase, max_size=3), between=phrase, gold=golds)
def test_retrieval_hit_equals_search_r1(blocks, between, gold):
    text = between.join(f"<information>{b}</information>" for b in blocks)
    assert retrieval_hit(text, gold) == search_r1_retrieval_correct(text, gold)


# GAIA answers: numbers with units and separators, lists, words with punctuation, and the floats
# Python's float() also reads ("1e3", "inf", "nan", "1_000", surrounding spaces).
NUMBERS = ["17", "17.0", "0.5", ".5", "1000", "1,000", "$1,000", "12.5%", "12.5", "125", "-3", "1e3", "1_000",
           " 42 ", "inf", "nan", "$", "%", ","]
TOKENS = NUMBERS + ["apple", "Apple", "banana", "St. Louis", "St Louis", "New York", "new-york", "sea gull",
                    "seagull", "a", "the"]
gaia_answer = st.one_of(
    st.lists(st.tuples(st.sampled_from(TOKENS), st.sampled_from([", ", ",", "; ", ";", " ", ""])), min_size=1,
             max_size=4).map(lambda parts: "".join(t + s for t, s in parts)),
    st.text(alphabet="0123456789$%,.; -abc", max_size=12),
)


@settings(max_examples=600, deadline=None)
@given(pred=gaia_answer, gold=gaia_answer)
def test_gaia_score_equals_official_question_scorer(official_gaia, pred, gold):
    assert gaia_score(pred, gold) == float(official_gaia(pred, gold)[0])


@pytest.mark.parametrize("pred,gold", [("1000", "$1,000"), ("125", "12.5%"), ("10, 20", "10%, 20%"),
                                       ("banana", "inf"), ("$1,000", "1000"), ("1, 2, $3", "1, 2, 3")])
def test_gaia_cases_that_tell_the_scorers_apart(official_gaia, pred, gold):
    """The cases where a scorer that also normalizes the gold scores differently (tests/test_agent_rewards.py)."""
    assert gaia_score(pred, gold) == float(official_gaia(pred, gold)[0])


@pytest.mark.shared_data
def test_metrics_equal_flashrags_on_real_golds(flashrag):
    """Every HotpotQA-dev and NQ-test gold set, scored against predictions a policy could give:
    a gold itself, a gold inside a longer answer, and in turn yes, no or another question's gold."""
    files = [shared_data("hotpotqa", "dev.jsonl"), shared_data("nq", "test.jsonl")]
    if not all(f.exists() for f in files):
        pytest.skip("../shared/data absent: the HotpotQA and NQ golds live outside the repo")
    gold_sets = [json.loads(line)["golden_answers"] for f in files for line in f.read_text().splitlines()]
    checked = 0
    for i, gold in enumerate(gold_sets):
        third = ("yes", "No.", gold_sets[(i * 7919) % len(gold_sets)][0])[i % 3]
        for pred in (gold[0], f"it is {gold[-1]}, I think", third):
            _check_flashrag(flashrag, pred, gold)
            checked += 1
    assert checked == 3 * len(gold_sets) > 30_000
