"""The per-sample record the agent emits in ``extra_logs``: building it and reading it back.

The key names are the contract in :mod:`agent_env.info_keys`; this module is the logic around
them: the agent fills the record (:func:`empty_metadata` in the episode, :func:`fill_action_ranges`
in the executor, :func:`encode_doc_id` for retrieved documents) and trainer-side tools read it
back (:func:`decode_turns`, used by the rollout records).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from agent_env import info_keys as K


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
    while K.turn_kind_key(k) in info_row:
        kind = _scalar(info_row[K.turn_kind_key(k)])
        if kind == K.PAD:
            break
        docs = []
        j = 0
        while K.turn_doc_key(k, j) in info_row:
            d = _scalar(info_row[K.turn_doc_key(k, j)])
            if d != K.PAD:
                docs.append(d)
            j += 1
        turns.append(Turn(K.KIND_NAMES.get(kind, "invalid"), _scalar(info_row.get(K.turn_start_key(k), K.PAD)),
                          _scalar(info_row.get(K.turn_end_key(k), K.PAD)), docs))
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
    meta: dict[str, int | float] = {k: 0 for k in K.COUNTER_KEYS}
    meta[K.FIRST_TOOL_TURN] = K.PAD
    meta[K.EM] = 0.0
    meta[K.F1] = 0.0
    for key in K.metadata_keys(max_turns, topk)[len(K.COUNTER_KEYS):]:
        meta[key] = K.PAD
    for k in range(K.max_turn_slots(max_turns)):  # a float key stays float in every sample
        meta[K.turn_think_sim_key(k)] = float(K.PAD)
    return meta


def fill_action_ranges(meta: dict, action_ranges, max_turns: int, max_len: int | None = None) -> dict:
    """Write `turn{k}_start/end` and ACTION_TOKENS from the executor's `action_ranges`."""
    for k in range(K.max_turn_slots(max_turns)):
        start, end = action_ranges[k] if k < len(action_ranges) else (K.PAD, K.PAD)
        meta[K.turn_start_key(k)] = int(start)
        meta[K.turn_end_key(k)] = int(end)
    meta[K.ACTION_TOKENS] = action_token_count(action_ranges, max_len)
    return meta
