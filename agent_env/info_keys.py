"""The metadata contract between the agent and the trainer: names of `Experience.info` keys.

This module is the single place these names live; other parts import the constants from here.
Building and reading a record (doc-id encoding, token ranges, decoding turns) is logic, and lives
beside its users in :mod:`agent_env.metadata`.

OpenRLHF copies each `extra_logs` entry into `info[key] = torch.tensor([value])` and its replay
buffer stacks `info` across samples, so every sample must carry the SAME keys and every value
must be a plain int/float scalar (no lists). Per-turn data therefore lives in fixed slots
`turn{k}_*` for k in 0..MAX_TURN_SLOTS-1 (MAX_TURN_SLOTS = max_turns + 1), padded with -1.

`turn{k}_think_sim` (float) is, for a search turn, the highest word-level similarity of its
`<think>` text to the `<think>` of any earlier search turn of the same rollout
(:mod:`agent_env.think`), PAD for other turns and for a search turn with no earlier one.
`format_ok` (0/1) is CalibAdv's authors' format verdict on the whole trajectory.

Token ranges: `turn{k}_start`/`turn{k}_end` are `action_ranges[k]` returned by
`MultiTurnAgentExecutor.execute`, i.e. half-open ranges over the concatenated token sequence
(`Experience.sequences`). OpenRLHF's `action_mask` is shifted by one: sequence token i is
action-mask column i-1 (`action_mask = mask[1:max_len]`).
"""

from __future__ import annotations

import re

# Cumulative per-sample counters (plain scalars).
TOOL_CALLS = "tool_calls"
SEARCH_CALLS = "search_calls"
CODE_CALLS = "code_calls"
INVALID_ACTIONS = "invalid_actions"
TOOL_ERRORS = "tool_errors"
TURNS = "turns"
ANSWERED = "answered"  # 0/1
FIRST_TOOL_TURN = "first_tool_turn"  # -1 if no tool was called
EM = "em"
F1 = "f1"
# Number of policy (action) tokens, tool tokens excluded: the length that response-length and
# overlong penalties must use (fix for OpenRLHF #1243, whose response_length spans tool tokens).
ACTION_TOKENS = "action_tokens"
# 1 when the trajectory passes the format check of CalibAdv's authors (Search-R1's structure:
# think -> (tool -> observation -> think)* -> answer with nothing stray, at least one search, no
# invalid action), else 0; CalibAdv calibrates only such rollouts and takes silver docs only
# from them.
FORMAT_OK = "format_ok"
# Per-tool shares of TOOL_ERRORS (search_errors + code_errors == tool_errors): which service failed.
SEARCH_ERRORS = "search_errors"
CODE_ERRORS = "code_errors"
# 1 when the per-trajectory wall-clock cap (AgentConfig.episode_timeout_s) ended the episode.
CAPPED = "capped"

COUNTER_KEYS = (TOOL_CALLS, SEARCH_CALLS, CODE_CALLS, INVALID_ACTIONS, TOOL_ERRORS, TURNS, ANSWERED,
                FIRST_TOOL_TURN, EM, F1, ACTION_TOKENS, FORMAT_OK, SEARCH_ERRORS, CODE_ERRORS, CAPPED)

# Turn kinds stored in `turn{k}_kind`.
KIND_NONE, KIND_SEARCH, KIND_CODE, KIND_ANSWER, KIND_INVALID = 0, 1, 2, 3, 4
KIND_CODES = {"none": KIND_NONE, "search": KIND_SEARCH, "code": KIND_CODE, "answer": KIND_ANSWER,
              "invalid": KIND_INVALID}
KIND_NAMES = {v: k for k, v in KIND_CODES.items()}
PAD = -1


def max_turn_slots(max_turns: int) -> int:
    """Tool turns plus the one final turn without tools."""
    return max_turns + 1


def turn_kind_key(k: int) -> str:
    return f"turn{k}_kind"


def turn_start_key(k: int) -> str:
    return f"turn{k}_start"


def turn_end_key(k: int) -> str:
    return f"turn{k}_end"


def turn_doc_key(k: int, j: int) -> str:
    return f"turn{k}_doc{j}"


def turn_think_sim_key(k: int) -> str:
    return f"turn{k}_think_sim"


_TURN_SLOT = re.compile(r"turn\d+_(kind|start|end|think_sim|doc\d+)")


def is_turn_slot_key(key: str) -> bool:
    """True for the per-turn slots (trainer inputs such as CalibAdv's), False for the counters."""
    return _TURN_SLOT.fullmatch(key) is not None


def metadata_keys(max_turns: int, topk: int) -> list[str]:
    """Every key a sample's `extra_logs` holds, in a fixed order (topk = MAX_DOCS_PER_TURN)."""
    keys = list(COUNTER_KEYS)
    for k in range(max_turn_slots(max_turns)):
        keys += [turn_kind_key(k), turn_start_key(k), turn_end_key(k), turn_think_sim_key(k)]
        keys += [turn_doc_key(k, j) for j in range(topk)]
    return keys
