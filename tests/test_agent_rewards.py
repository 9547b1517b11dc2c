"""Reward functions on known pairs (agent_env.rewards)."""

import pytest

from agent_env.rewards import (
    FormatCoefficients, exact_match, extract_answer, format_reward, gaia_match, gaia_score, is_valid_sequence,
    normalize_answer, parse_golds, sub_exact_match, token_f1,
)


@pytest.mark.parametrize("raw,norm", [
    ("The Eiffel Tower", "eiffel tower"),
    ("  a  Tale of Two   Cities! ", "tale of two cities"),
    ("U.S.A.", "usa"),
    ("An apple, the pear.", "apple pear"),
    ("Theatre", "theatre"),  # 'the' only as a whole word
])
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


@pytest.mark.parametrize("pred,golds,em,sub,f1", [
    ("Paris", ["paris"], 1.0, 1.0, 1.0),
    ("the Paris.", ["Paris"], 1.0, 1.0, 1.0),
    ("Paris, France", ["Paris"], 0.0, 1.0, 2 / 3),
    ("London", ["Paris", "paris city"], 0.0, 0.0, 0.0),
    ("paris city", ["Paris", "Paris City"], 1.0, 1.0, 1.0),
    ("city of paris", ["Paris", "paris city"], 0.0, 1.0, 0.8),
    ("", ["Paris"], 0.0, 0.0, 0.0),
])
def test_em_subem_f1(pred, golds, em, sub, f1):
    assert exact_match(pred, golds) == em
    assert sub_exact_match(pred, golds) == sub
    assert token_f1(pred, golds) == pytest.approx(f1)


@pytest.mark.parametrize("label,golds", [
    ('["Paris", "paris city"]', ["Paris", "paris city"]),
    ("Paris", ["Paris"]),
    ('"Paris"', ["Paris"]),
    (["a", "b"], ["a", "b"]),
    ('{"target": ["x"]}', ["x"]),
    ("[not json", ["[not json"]),
])
def test_parse_golds(label, golds):
    assert parse_golds(label) == golds


@pytest.mark.parametrize("pred,gold,score", [
    ("$1,000", "1000", 1.0),
    ("12.5%", "12.5", 1.0),
    ("17", "17.0", 1.0),
    ("seventeen", "17", 0.0),
    ("apple, banana; 3", "Apple,banana,3.0", 1.0),
    ("apple, banana", "apple, banana, cherry", 0.0),
    ("apple, 4", "apple, 3", 0.0),
    ("New York City", "new-york city", 1.0),
    ("Saint Petersburg", "St. Petersburg", 0.0),
])
def test_gaia_scorer(pred, gold, score):
    assert gaia_score(pred, gold) == score


def test_gaia_match_takes_best_gold():
    assert gaia_match("42", ["41", "42"]) == 1.0


GOOD = ("<think>need info</think><search>q</search>\n\n<information>Doc 1(Title: Paris) Paris is the capital"
        "</information>\n\n<think>got it</think><answer>Paris</answer>")


def test_valid_sequence_and_answer_extraction():
    assert is_valid_sequence(GOOD)
    assert is_valid_sequence("<think>x</think>\n<answer>y</answer>")
    assert not is_valid_sequence("<answer>y</answer>")  # must think first
    assert not is_valid_sequence("<think>x</think> stray text <answer>y</answer>")
    assert not is_valid_sequence("<think>x</think><search>q</search><answer>y</answer>")  # no information
    assert not is_valid_sequence("<think>x</think>")
    assert extract_answer(GOOD) == "Paris"
    assert extract_answer("no answer") is None


def test_format_reward_search_r1_semantics():
    coef = FormatCoefficients(structure_format_score=0.2, final_format_score=0.1, retrieval_score=0.1)
    assert format_reward(GOOD, ["Paris"], "em", coef) == 1.0
    broken_right = "<answer>Paris</answer>"
    assert format_reward(broken_right, ["Paris"], "em", coef) == pytest.approx(0.8)
    wrong_valid_hit = GOOD.replace("<answer>Paris</answer>", "<answer>Lyon</answer>")
    assert format_reward(wrong_valid_hit, ["Paris"], "em", coef) == pytest.approx(0.3)
    wrong_valid_miss = wrong_valid_hit.replace("Title: Paris) Paris is the capital", "Title: Lyon) Lyon is big")
    assert format_reward(wrong_valid_miss, ["Paris"], "em", coef) == pytest.approx(0.2)
    assert format_reward("<answer>Lyon</answer>", ["Paris"], "em", coef) == pytest.approx(0.1)
    assert format_reward("nothing", ["Paris"], "em", coef) == 0.0
