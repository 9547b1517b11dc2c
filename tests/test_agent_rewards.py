"""Reward functions on known pairs (agent_env.rewards)."""

import pytest

from agent_env.actions import answer_of
from agent_env.rewards import (
    FormatCoefficients,
    exact_match,
    format_reward,
    gaia_match,
    gaia_score,
    is_valid_sequence,
    normalize_answer,
    parse_golds,
    retrieval_hit,
    sub_exact_match,
    token_f1,
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
    # a plain-string gold is one answer, not its characters
    ("P", "Paris", 0.0, 0.0, 0.0),
    ("Paris", "Paris", 1.0, 1.0, 1.0),
    # FlashRAG / HotpotQA: yes, no and noanswer earn no partial F1 against anything else
    ("yes", ["yes"], 1.0, 1.0, 1.0),
    ("Yes.", ["yes"], 1.0, 1.0, 1.0),
    ("yes it is", ["yes"], 0.0, 1.0, 0.0),
    ("yes", ["yes it is"], 0.0, 0.0, 0.0),
    ("no", ["no way", "no"], 1.0, 1.0, 1.0),
    ("noanswer", ["no answer"], 0.0, 0.0, 0.0),
    ("no answer", ["no"], 0.0, 1.0, 0.0),
    # a gold that normalizes to "": peer-exact sub-EM is 1 for any prediction (docstring)
    ("Lyon", ["!!!"], 0.0, 1.0, 0.0),
    ("", ["The The"], 1.0, 1.0, 0.0),
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


# Official GAIA `question_scorer` outcomes; the first block is where it differs from a scorer that
# also normalizes the gold (strips `$ % ,` from it) as ours used to.
@pytest.mark.parametrize("pred,gold,score", [
    ("1000", "$1,000", 0.0),         # the gold does not float(): a list ["$1", "000"], lengths differ
    ("$1,000", "$1,000", 1.0),       # ...element-wise: "$1" as a string, "000" as the number 0
    ("1000", "1,000", 0.0),
    ("125", "12.5%", 1.0),           # the gold is a string: punctuation goes, "125" == "125"
    ("10, 20", "10%, 20%", 0.0),     # list elements that do not float() compare as strings
    ("banana", "inf", 1.0),          # a prediction that is no number normalizes to inf (sic)
    ("nan", "nan", 0.0),
    ("$1,000", "1000", 1.0),         # only the prediction loses `$ % ,`
    ("12.5%", "12.5", 1.0),
    ("17", "17.0", 1.0),
    (" 17 ", "17", 1.0),
    ("seventeen", "17", 0.0),
    ("1, 2, $3", "1, 2, 3", 1.0),
    ("apple, banana; 3", "Apple,banana,3.0", 1.0),
    ("apple, banana", "apple, banana, cherry", 0.0),
    ("apple, 4", "apple, 3", 0.0),
    ("St. Louis, Paris", "St Louis, Paris", 0.0),  # list strings keep their punctuation
    ("New York City", "new-york city", 1.0),
    ("Saint Petersburg", "St. Petersburg", 0.0),
])
def test_gaia_scorer(pred, gold, score):
    assert gaia_score(pred, gold) == score


def test_gaia_match_takes_best_gold_and_a_string_is_one_gold():
    assert gaia_match("42", ["41", "42"]) == 1.0
    assert gaia_match("4", "42") == 0.0


GOOD = ("<think>need info</think><search>q</search>\n\n<information>Doc 1(Title: \"Paris\") Paris is the capital"
        "</information>\n\n<think>got it</think><answer>Paris</answer>")


def test_valid_sequence_and_answer_extraction():
    assert is_valid_sequence(GOOD)
    assert is_valid_sequence("<think>x</think>\n<answer>y</answer>")
    assert not is_valid_sequence("<answer>y</answer>")  # must think first
    assert not is_valid_sequence("<think>x</think> stray text <answer>y</answer>")
    assert not is_valid_sequence("<think>x</think><search>q</search><answer>y</answer>")  # no information
    assert not is_valid_sequence("<think>x</think>")
    assert answer_of("<think>got it</think><answer> Paris </answer>") == "Paris"
    assert answer_of("no answer") is None
    assert answer_of("<think>maybe <answer>Paris</answer>") is None  # inside an unclosed think
    assert answer_of("<think>a <answer>Lyon</answer></think><answer>Paris</answer>") == "Paris"
    assert answer_of("<answer>Paris</answer><search>more</search>") is None  # the turn's action is a search
    assert answer_of("<answer> </answer>") is None


def test_retrieval_hit_is_per_information_block():
    """Search-R1's `is_retrieval_correct` looks inside each block, never across two."""
    two = "<information>... New</information> <information>York ...</information>"
    assert not retrieval_hit(two, ["New York"])
    assert retrieval_hit(two + "<information>in New York</information>", "New York")


def test_format_reward_search_r1_semantics():
    coef = FormatCoefficients(structure_format_score=0.2, final_format_score=0.1, retrieval_score=0.1)
    assert format_reward(GOOD, "Paris", ["Paris"], "em", coef) == 1.0
    broken_right = "<answer>Paris</answer>"
    assert format_reward(broken_right, "Paris", ["Paris"], "em", coef) == pytest.approx(0.8)
    wrong_valid_hit = GOOD.replace("<answer>Paris</answer>", "<answer>Lyon</answer>")
    assert format_reward(wrong_valid_hit, "Lyon", ["Paris"], "em", coef) == pytest.approx(0.3)
    wrong_valid_miss = wrong_valid_hit.replace('Title: "Paris") Paris is the capital', 'Title: "Lyon") Lyon is big')
    assert format_reward(wrong_valid_miss, "Lyon", ["Paris"], "em", coef) == pytest.approx(0.2)
    assert format_reward("<answer>Lyon</answer>", "Lyon", ["Paris"], "em", coef) == pytest.approx(0.1)
    assert format_reward("nothing", None, ["Paris"], "em", coef) == 0.0


@pytest.mark.parametrize("final_turn", [
    "<think>maybe <answer>Paris</answer>",                     # answer inside an unclosed think
    "<think>x</think><search>q</search>",                      # the last turn searched instead
])
def test_an_answer_the_parser_does_not_count_earns_no_reward(final_turn):
    """One extraction rule: what EM and `answered` call "no answer" gets no answer credit either."""
    coef = FormatCoefficients(structure_format_score=0.2, final_format_score=0.1)
    earlier = "<think>a</think><search>q</search>\n\n<information>Doc 1(Title: x) <answer>Paris</answer>" \
              "</information>\n\n"  # tool output that prints an answer tag
    response = earlier + final_turn
    answer = answer_of(final_turn)
    assert answer is None
    assert format_reward(response, answer, ["Paris"], "em", coef) == 0.0
