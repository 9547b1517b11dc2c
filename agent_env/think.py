"""A turn's ``<think>`` text and how alike two of them are (word-level edit distance).

CalibAdv's authors (github.com/wujwyi/CalibAdv, ``verl/trainer/main_ppo_format.py``) give a search
turn no credit when its reasoning repeats an earlier search turn's: the two ``<think>`` texts are
split on whitespace and compared by the Levenshtein distance over *words*, normalized by the
longer text (``1 - distance / max(len_a, len_b)``; two empty texts count as unalike, 0). The
agent is the only place that still has the text, so it computes each search turn's highest
similarity to the earlier ones and hands the trainer that one number per turn
(``agent_env.info_keys.turn_think_sim_key``); the threshold stays a trainer option.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_OPEN, _CLOSE = "<think>", "</think>"


def think_text(turn_text: str) -> str:
    """The reasoning of one turn: its ``<think>`` blocks joined by a space.

    A turn that closes a think it never opened (a prompt ending in ``<think>``) counts from its
    start, as the authors read a response that does not begin with the tag. A well-formatted turn
    has exactly one block; extra blocks are joined rather than dropped.
    """
    close = turn_text.find(_CLOSE)
    opening = turn_text.find(_OPEN)
    if close >= 0 and (opening < 0 or close < opening):
        turn_text = _OPEN + turn_text
    return " ".join(_THINK.findall(turn_text))


def word_edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance between two word lists (insert, delete, substitute: cost 1 each)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, word in enumerate(a, start=1):
        current = [i]
        for j, other in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other)))
        previous = current
    return previous[-1]


def word_similarity(a: str, b: str) -> float:
    """``1 - word_edit_distance / longer word count``, in [0, 1]; 0 when both texts are empty."""
    wa, wb = a.split(), b.split()
    longest = max(len(wa), len(wb))
    if longest == 0:
        return 0.0
    return 1.0 - word_edit_distance(wa, wb) / longest


def max_similarity(text: str, earlier: Sequence[str]) -> float | None:
    """Highest :func:`word_similarity` of ``text`` to any of ``earlier``; None when there is none."""
    return max((word_similarity(text, other) for other in earlier), default=None)
