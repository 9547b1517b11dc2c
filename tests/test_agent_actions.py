"""Table-driven tests of the action parser (agent_env.actions)."""

import pytest
from peer_rules import SEARCH_R1_INVALID_ACTION

from agent_env.actions import STOP_STRINGS, corrective_observation, parse_action, strip_code_fence

ALL = ("search", "code", "answer")
SR1 = ("search", "answer")

CASES = [
    # (text, allowed, kind, content)
    ("<search>capital of France</search>", ALL, "search", "capital of France"),
    ("<think>I need facts</think>\n<search> capital of France </search>", ALL, "search", "capital of France"),
    ("<think>ok</think><answer>Paris</answer>", ALL, "answer", "Paris"),
    ("<answer> Paris </answer>", ALL, "answer", "Paris"),
    ("<answer>\nParis, France\n</answer>", ALL, "answer", "Paris, France"),
    ("<code>print(1+1)</code>", ALL, "code", "print(1+1)"),
    ("<code>\n```python\nprint(2)\n```\n</code>", ALL, "code", "print(2)"),
    ("<code>```py\nx = 1\nprint(x)\n```</code>", ALL, "code", "x = 1\nprint(x)"),
    ("<code>\nfor i in range(2):\n    print(i)\n</code>", ALL, "code", "for i in range(2):\n    print(i)"),
    ("<code>```\nprint(3)\n```</code>", ALL, "code", "print(3)"),
    ("<code> print(42) </code>", ALL, "code", "print(42)"),  # the margin after the tag is not an indent
    ("<code>\n    x = 1\n    if x:\n        print(x)\n</code>", ALL, "code", "x = 1\nif x:\n    print(x)"),
    # tags inside <think> do not count
    ("<think>maybe <search>x</search></think><answer>y</answer>", ALL, "answer", "y"),
    ("<think>I could <answer>guess</answer></think><search>real query</search>", ALL, "search", "real query"),
    ("<think>only thinking <search>q</search></think>", ALL, "none", ""),
    ("<think>unclosed think <search>q</search>", ALL, "none", ""),
    # last complete tag wins
    ("<search>first</search> then <answer>second</answer>", ALL, "answer", "second"),
    ("<answer>a</answer><search>b</search>", ALL, "search", "b"),
    # unclosed tag at the token limit
    ("<think>x</think><search>who wrote", ALL, "invalid", ""),
    ("<answer>Par", ALL, "invalid", ""),
    ("<code>print(1", ALL, "invalid", ""),
    # empty content
    ("<search></search>", ALL, "invalid", ""),
    ("<search>   \n </search>", ALL, "invalid", ""),
    ("<answer> </answer>", ALL, "invalid", ""),
    ("<code>``` ```</code>", ALL, "invalid", ""),
    ("<code>\n```python\n\n```\n</code>", ALL, "invalid", ""),
    # unknown / unavailable tags
    ("<tool>calc</tool>", ALL, "invalid", ""),
    ("<python>print(1)</python>", ALL, "invalid", ""),
    ("<information>made up</information>", ALL, "invalid", ""),
    ("<code>print(1)</code>", SR1, "invalid", "print(1)"),
    # no action at all
    ("The answer is Paris.", ALL, "none", ""),
    ("", ALL, "none", ""),
    ("x < y and y > z", ALL, "none", ""),
    ("<think>plan</think> I will now answer: Paris", ALL, "none", ""),
    # mismatched closing tag is not a complete action
    ("<search>query</answer>", ALL, "invalid", ""),
    # a stray closing tag elsewhere does not hide the action
    ("</think><search>q2</search>", ALL, "search", "q2"),
]


@pytest.mark.parametrize("text,allowed,kind,content", CASES)
def test_parse_action_table(text, allowed, kind, content):
    action = parse_action(text, allowed)
    assert action.kind == kind, action
    assert action.content == content
    if kind == "invalid":
        assert action.reason  # invalid actions say why, for logs


def test_table_is_large_enough():
    assert len(CASES) >= 30


def test_invalid_reasons_name_the_problem():
    assert "unclosed <search>" in parse_action("<search>abc").reason
    assert "empty <answer>" in parse_action("<answer></answer>").reason
    assert "unknown tag <tool>" in parse_action("<tool>x</tool>").reason


def test_stop_strings_close_every_action():
    for tag in ("search", "code", "answer"):
        assert f"</{tag}>" in STOP_STRINGS


def test_corrective_observation_uses_search_r1_wording():
    text = corrective_observation(SR1)
    assert text == SEARCH_R1_INVALID_ACTION  # byte for byte
    assert "<code>" not in text
    assert "<code> and </code>" in corrective_observation(ALL)


def test_strip_code_fence_keeps_bare_code():
    assert strip_code_fence("print('```')") == "print('```')"


def test_the_unisolated_test_server_does_not_ship_in_the_package():
    """Issue #15: the code runner without isolation is a test helper (tests/agent_fakes.py) only."""
    from pathlib import Path

    import agent_env

    assert not (Path(agent_env.__file__).parent / "testing.py").exists()
