"""One trajectory -> one sample record; one prompt's samples -> one group record.

The input is what every runner already holds for a sample: the token ids of the whole
trajectory (prompt, policy turns, tool outputs), the agent's ``Experience.info`` row and the
reward. The policy turns are the ``turn{k}_start/end`` token ranges of that row
(:mod:`agent_env.info_keys`); everything between the end of turn k and the start of turn k+1 is
the tool output the environment fed back. So the text is rebuilt by decoding those slices with
the policy's tokenizer: no runner has to keep strings around, and the cluster path (which only
has ``Experience.sequences``) gets the same records as the single-machine one.

The turn's kind comes from the agent's own slot (``turn{k}_kind``), never from re-reading the
text; the query shown is the parsed action's content, for display only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent_env import info_keys as K
from agent_env import metadata as M
from agent_env.actions import ACTION_TAGS, parse_action

SCHEMA_VERSION = 1

# Per-sample counters copied from the info row into the record (names as in info_keys).
COUNTERS = (K.TOOL_CALLS, K.SEARCH_CALLS, K.CODE_CALLS, K.INVALID_ACTIONS, K.TOOL_ERRORS, K.TURNS, K.ANSWERED,
            K.ACTION_TOKENS)


@dataclass(frozen=True)
class RecordLimits:
    """Character caps that bound a record's size (a 500-token observation is ~2,000 chars)."""

    text_chars: int = 4000  # one policy turn (think + action)
    output_chars: int = 1500  # one tool output: retrieved passages, sandbox stdout
    question_chars: int = 2000

    def __post_init__(self) -> None:
        for name in ("text_chars", "output_chars", "question_chars"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"RecordLimits.{name} must be >= 1, got {getattr(self, name)!r}")


@dataclass
class Trajectory:
    """One sample as any runner holds it (a local ``Sample``, one row of an OpenRLHF ``Experience``)."""

    token_ids: Sequence[int]  # the max_len-truncated sequence, padding removed
    info: Mapping[str, float | int]  # the Experience.info row: agent counters and turn slots
    reward: float
    score: float | None = None
    truncated: bool = False  # the last generation hit its token limit
    # Token advantages in action-mask columns (column i <-> token i+1), after CalibAdv when on.
    token_advantages: Sequence[float] | None = None
    sapo: Mapping[str, float] | None = None  # per-sample SAPO stats, when the caller has them


def finite(value) -> float | None:
    """A JSON-safe float: NaN/inf (and None) become None."""
    if value is None:
        return None
    value = float(value.item() if hasattr(value, "item") else value)
    return value if math.isfinite(value) else None


def clip_text(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit]


def _decode(tokenizer, ids: Sequence[int]) -> str:
    # Special tokens stay visible: an <|im_end|> tells the reader where the policy stopped.
    return tokenizer.decode(list(ids), skip_special_tokens=False) if len(ids) else ""


def _query(kind: str, text: str) -> str | None:
    """The action's content (search query, code, answer) when the agent's kind says there is one."""
    if kind not in ACTION_TAGS:
        return None
    action = parse_action(text, ACTION_TAGS)
    return action.content if action.kind == kind else None


def _mean_over(values: Sequence[float] | None, lo: int, hi: int) -> float | None:
    if values is None or hi <= lo:
        return None
    part = values[lo:hi]
    n = len(part)
    return finite(sum(float(v) for v in part) / n) if n else None


def turn_records(traj: Trajectory, tokenizer, limits: RecordLimits = RecordLimits(),
                 calib_scores: Sequence[float] | None = None) -> list[dict]:
    """Every policy turn with its text, parsed query, and the tool output that followed it.

    Ranges past the truncated sequence are clipped (a turn cut by ``max_len`` keeps its visible
    part; one wholly past it has 0 tokens and ``clipped: true``).
    """
    ids = list(traj.token_ids)
    length = len(ids)
    turns = M.decode_turns(traj.info)
    out = []
    for k, turn in enumerate(turns):
        start, end = min(max(turn.start, 0), length), min(max(turn.end, 0), length)
        nxt = min(max(turns[k + 1].start, end), length) if k + 1 < len(turns) else length
        text = _decode(tokenizer, ids[start:end])
        output = _decode(tokenizer, ids[end:nxt])
        record = {
            "kind": turn.kind, "text": clip_text(text, limits.text_chars), "query": _query(turn.kind, text),
            "start": start, "tokens": end - start, "output": clip_text(output, limits.output_chars),
            "output_tokens": nxt - end, "output_chars": len(output), "doc_ids": turn.doc_ids,
        }
        if turn.end > length:
            record["clipped"] = True
        if traj.token_advantages is not None:
            # token t is advantage column t - 1
            record["adv_mean"] = _mean_over(traj.token_advantages, max(start - 1, 0), max(end - 1, 0))
        if calib_scores is not None and k < len(calib_scores):
            record["calib_score"] = finite(calib_scores[k])
        out.append(record)
    return out


def sample_record(traj: Trajectory, tokenizer, index: int, stratum: int, stratum_label: str,
                  advantage: float | None = None, san: float | None = None, gn: float | None = None,
                  limits: RecordLimits = RecordLimits(), calib_scores: Sequence[float] | None = None) -> dict:
    """One trajectory: outcome, stratum, advantages (None where the run has none) and its turns."""
    info = traj.info
    turns = turn_records(traj, tokenizer, limits, calib_scores)
    record = {
        "sample": index, "reward": finite(traj.reward), "score": finite(traj.score),
        "em": finite(info.get(K.EM)), "f1": finite(info.get(K.F1)),
        "stratum": int(stratum), "stratum_label": stratum_label,
        "advantage": finite(advantage), "san": finite(san), "gn": finite(gn),
        **{key: int(finite(info.get(key)) or 0) for key in COUNTERS},
        "truncated": bool(traj.truncated), "total_tokens": len(traj.token_ids),
        "prompt_tokens": turns[0]["start"] if turns else len(traj.token_ids),
        "turns": turns,
    }
    if traj.sapo:
        record["sapo"] = {k: finite(v) for k, v in traj.sapo.items()}
    return record


def group_record(*, phase: str, step: int, group: int, prompt_id: str, question: str, golds: list[str],
                 samples: list[dict], meta: Mapping[str, object] | None = None, dataset: str | None = None,
                 limits: RecordLimits = RecordLimits()) -> dict:
    """One prompt with its samples: the unit written per line (a crash loses at most one group)."""
    record = {
        "schema_version": SCHEMA_VERSION, "phase": phase, "step": int(step), "group": int(group),
        "prompt_id": str(prompt_id), "question": clip_text(question, limits.question_chars),
        "golds": [str(g) for g in golds], "n": len(samples),
    }
    if dataset is not None:
        record["dataset"] = dataset
    record.update(meta or {})
    record["samples"] = samples
    return record
