"""Action parsing: which tool (if any) the policy called at the end of a generation turn.

Generation stops at STOP_STRINGS, so a turn normally ends with its action. The action is the
last complete `<search>|<code>|<answer>` element outside `<think>` blocks; anything else that
looks like an attempt (unclosed tag at the token limit, empty content, an unknown tag) is
`invalid` and gets a corrective observation. Plain text with no tag at all is `none`.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

SEARCH, CODE, ANSWER, INVALID, NONE = "search", "code", "answer", "invalid", "none"
ACTION_TAGS = (SEARCH, CODE, ANSWER)
STOP_STRINGS = ("</search>", "</code>", "</answer>")

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_OPEN_THINK_TAIL = re.compile(r"<think>.*\Z", re.DOTALL)
_ACTION = re.compile(r"<(search|code|answer)>(.*?)</\1>", re.DOTALL)
_OPEN_ACTION = re.compile(r"<(search|code|answer)>", re.DOTALL)
_ANY_TAG = re.compile(r"</?([A-Za-z_][\w-]*)>")
_FENCE_LANG = re.compile(r"[\w+.-]*")


@dataclass(frozen=True)
class Action:
    """What the turn asked for; `reason` says why an action is invalid (for logs)."""

    kind: str
    content: str = ""
    reason: str = ""

    @property
    def is_tool(self) -> bool:
        return self.kind in (SEARCH, CODE)


def strip_think(text: str) -> str:
    """Drop `<think>` blocks (and an unclosed trailing one): tags inside them do not count."""
    return _OPEN_THINK_TAIL.sub("", _THINK_BLOCK.sub(" ", text))


def strip_code_fence(code: str) -> str:
    """`<code>` may hold bare code or one ```python fenced block; return the code itself."""
    text = code.strip()
    if not text.startswith("```"):
        return code
    body = text[3:]
    first, newline, rest = body.partition("\n")
    if newline and _FENCE_LANG.fullmatch(first.strip()):
        body = rest
    body = body.rstrip()
    body = body.removesuffix("```")
    return body.strip("\n")


def parse_action(text: str, allowed: tuple[str, ...] = ACTION_TAGS) -> Action:
    """Parse one turn's generated text into an Action.

    `allowed` lists the action tags this template offers; others count as unknown tags.
    """
    visible = strip_think(text)
    matches = list(_ACTION.finditer(visible))
    if matches:
        last = matches[-1]
        kind, raw = last.group(1), last.group(2)
        if kind not in allowed:
            return Action(INVALID, raw.strip(), f"tag <{kind}> is not available")
        # code keeps its relative indentation, minus the margin a model puts after the tag
        # (`<code> print(42) </code>` would be an IndentationError as written)
        content = textwrap.dedent(strip_code_fence(raw).strip("\n")).rstrip() if kind == CODE else raw.strip()
        if not content.strip():
            return Action(INVALID, "", f"empty <{kind}>")
        return Action(kind, content)
    opened = _OPEN_ACTION.findall(visible)
    if opened:
        return Action(INVALID, "", f"unclosed <{opened[-1]}>")
    tags = [t for t in _ANY_TAG.findall(visible) if t != "think"]
    if tags:
        return Action(INVALID, "", f"unknown tag <{tags[-1]}>")
    return Action(NONE, "", "no action tag")


def answer_of(text: str) -> str | None:
    """The answer a turn gives, or None: the one rule behind the reward, EM, F1, `answered` and the
    evaluation's `prediction`. It is the turn's action as `parse_action` reads it, when that is a
    non-empty `<answer>`: an `<answer>` inside a `<think>` (closed or not) does not count."""
    action = parse_action(text)
    return action.content if action.kind == ANSWER else None


def corrective_observation(allowed: tuple[str, ...] = ACTION_TAGS) -> str:
    """Search-R1's wording for an invalid turn, extended with `<code>` when the template has it."""
    parts = ["\nMy previous action is invalid. "]
    if SEARCH in allowed:
        parts.append("If I want to search, I should put the query between <search> and </search>. ")
    if CODE in allowed:
        parts.append("If I want to run code, I should put the Python code between <code> and </code>. ")
    parts.append("If I want to give the final answer, I should put the answer between <answer> and </answer>. "
                 "Let me try again.\n")
    return "".join(parts)
