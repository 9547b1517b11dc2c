"""The metadata contract between the agent and the trainer: names of `Experience.info` keys.

This module is the single place these names live; other parts import the constants from here.

OpenRLHF copies each `extra_logs` entry into `info[key] = torch.tensor([value])` and its replay
buffer stacks `info` across samples, so every sample must carry the SAME keys and every value
must be a plain int/float scalar (no lists). Per-turn data therefore lives in fixed slots
`turn{k}_*` for k in 0..MAX_TURN_SLOTS-1 (MAX_TURN_SLOTS = max_turns + 1), padded with -1.

Token ranges: `turn{k}_start`/`turn{k}_end` are `action_ranges[k]` returned by
`MultiTurnAgentExecutor.execute`, i.e. half-open ranges over the concatenated token sequence
(`Experience.sequences`). OpenRLHF's `action_mask` is shifted by one: sequence token i is
action-mask column i-1 (`action_mask = mask[1:max_len]`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

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

COUNTER_KEYS = (TOOL_CALLS, SEARCH_CALLS, CODE_CALLS, INVALID_ACTIONS, TOOL_ERRORS, TURNS, ANSWERED,
                FIRST_TOOL_TURN, EM, F1, ACTION_TOKENS)

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


_TURN_SLOT = re.compile(r"turn\d+_(kind|start|end|doc\d+)")


def is_turn_slot_key(key: str) -> bool:
    """True for the per-turn slots (trainer inputs such as CalibAdv's), False for the counters."""
    return _TURN_SLOT.fullmatch(key) is not None


def metadata_keys(max_turns: int, topk: int) -> list[str]:
    """Every key a sample's `extra_logs` holds, in a fixed order (topk = MAX_DOCS_PER_TURN)."""
    keys = list(COUNTER_KEYS)
    for k in range(max_turn_slots(max_turns)):
        keys += [turn_kind_key(k), turn_start_key(k), turn_end_key(k)]
        keys += [turn_doc_key(k, j) for j in range(topk)]
    return keys


def encode_doc_id(doc_id: str | int) -> int:
    """Corpus id as int64: the integer itself when it is one, else a stable 63-bit hash.

    Python's hash() is salted per process, so a digest keeps ids equal across Ray workers.
    """
    text = str(doc_id).strip()
    if text.lstrip("-").isdigit():
        value = int(text)
        if 0 <= value < 2**63:
            return value
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**63 - 1)


@dataclass
class Turn:
    """One generation turn rebuilt from a sample's scalar slots."""

    kind: str
    start: int
    end: int
    doc_ids: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return max(0, self.end - self.start)


def _scalar(value) -> int:
    """Accept python numbers and 1-element tensors/arrays (what `Experience.info` rows hold)."""
    if hasattr(value, "item"):
        value = value.item()
    return int(value)


def decode_turns(info_row: dict) -> list[Turn]:
    """Per-turn (kind, start, end, doc_ids) of one sample, stopping at the first empty slot."""
    turns: list[Turn] = []
    k = 0
    while turn_kind_key(k) in info_row:
        kind = _scalar(info_row[turn_kind_key(k)])
        if kind == PAD:
            break
        docs = []
        j = 0
        while turn_doc_key(k, j) in info_row:
            d = _scalar(info_row[turn_doc_key(k, j)])
            if d != PAD:
                docs.append(d)
            j += 1
        turns.append(Turn(KIND_NAMES.get(kind, "invalid"), _scalar(info_row.get(turn_start_key(k), PAD)),
                          _scalar(info_row.get(turn_end_key(k), PAD)), docs))
        k += 1
    return turns


def action_token_count(action_ranges, max_len: int | None = None) -> int:
    """Policy tokens in `action_ranges`, clipped to the trainer's `max_len` truncation."""
    total = 0
    for start, end in action_ranges:
        if max_len is not None:
            end = min(end, max_len)
        total += max(0, end - start)
    return total


def empty_metadata(max_turns: int, topk: int) -> dict[str, int | float]:
    """The all-keys record with neutral values (-1 slots), used before any step ran."""
    meta: dict[str, int | float] = {k: 0 for k in COUNTER_KEYS}
    meta[FIRST_TOOL_TURN] = PAD
    meta[EM] = 0.0
    meta[F1] = 0.0
    for key in metadata_keys(max_turns, topk)[len(COUNTER_KEYS):]:
        meta[key] = PAD
    return meta


def fill_action_ranges(meta: dict, action_ranges, max_turns: int, max_len: int | None = None) -> dict:
    """Write `turn{k}_start/end` and ACTION_TOKENS from the executor's `action_ranges`."""
    for k in range(max_turn_slots(max_turns)):
        start, end = action_ranges[k] if k < len(action_ranges) else (PAD, PAD)
        meta[turn_start_key(k)] = int(start)
        meta[turn_end_key(k)] = int(end)
    meta[ACTION_TOKENS] = action_token_count(action_ranges, max_len)
    return meta
