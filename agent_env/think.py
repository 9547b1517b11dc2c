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
    """Levenshtein distance between two word lists (insert, delete, substitute: cost 1 each).

    Bit-parallel (Myers 1999, in Hyyro's formulation for the global distance): one column of the
    dynamic-programming table per word of ``b``, held as bit vectors over the words of ``a``, so a
    pair of 200-word thinks costs ~200 big-int steps instead of 40,000 table cells. The agent runs
    this inside the rollout's event loop for every search turn.
    """
    if not a or not b:
        return len(a) + len(b)
    m = len(a)
    full, top = (1 << m) - 1, 1 << (m - 1)
    positions: dict[str, int] = {}  # word -> bit mask of where it occurs in `a`
    for i, word in enumerate(a):
        positions[word] = positions.get(word, 0) | (1 << i)
    plus, minus, distance = full, 0, m  # vertical +1 / -1 deltas of the current column
    for word in b:
        eq = positions.get(word, 0)
        xv = eq | minus
        xh = (((eq & plus) + plus) ^ plus) | eq
        h_plus = minus | (~(xh | plus) & full)
        h_minus = plus & xh
        if h_plus & top:
            distance += 1
        elif h_minus & top:
            distance -= 1
        h_plus = ((h_plus << 1) | 1) & full  # row 0 grows by one per word of `b`
        h_minus = (h_minus << 1) & full
        plus = h_minus | (~(xv | h_plus) & full)
        minus = h_plus & xv
    return distance


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
