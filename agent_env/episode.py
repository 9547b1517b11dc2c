"""One multi-turn episode: parse the turn's action, run the tool, build the observation, and
keep the cumulative metadata that ends up in `Experience.info`.

Turns 0..max_turns-1 may call tools; turn `max_turns` is the final turn, where no tool runs and
the episode ends whatever the policy wrote. The reward is given only when the episode ends.

A failed tool call (dead service, time-out, an answer outside the schema) is still a call: it
counts in `tool_calls` and its tool's `*_calls`, hence in the stratum, and also in `tool_errors`
and `search_errors`/`code_errors`; the policy sees the failure as the observation. With a
wall-clock cap (`episode_timeout_s`), no tool call starts past the deadline and one in flight
is cut there; the episode then ends with what it has and `capped` = 1.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from agent_env import info_keys as K
from agent_env import metadata as M
from agent_env.actions import (
    ANSWER,
    CODE,
    INVALID,
    NONE,
    SEARCH,
    Action,
    corrective_observation,
    parse_action,
)
from agent_env.config import AgentConfig
from agent_env.observations import Truncator, format_docs, information_block, result_block
from agent_env.rewards import (
    METRICS,
    FormatCoefficients,
    exact_match,
    format_reward,
    is_valid_sequence,
    token_f1,
)
from agent_env.think import max_similarity, think_text


@dataclass
class TurnRecord:
    kind: str
    doc_ids: list[int] = field(default_factory=list)
    think: str = ""
    # search turns: highest word similarity of `think` to an earlier search turn's (None: no earlier one)
    think_sim: float | None = None


@dataclass
class StepOutcome:
    """What the environment answers to one turn."""

    observation: str
    done: bool
    reward: float
    score: float
    metadata: dict


class Episode:
    """State of one trajectory; `await step(action_text)` once per generation turn."""

    def __init__(self, cfg: AgentConfig, tools, golds: list[str], truncate: Truncator,
                 deadline: float | None = None):
        """``deadline``: ``time.monotonic()`` past which the episode ends (None: no cap)."""
        self.cfg, self.tools, self.golds, self.truncate = cfg, tools, golds, truncate
        self.deadline = deadline
        self.allowed = cfg.allowed_actions
        self.turns: list[TurnRecord] = []
        self.counts = {K.TOOL_CALLS: 0, K.SEARCH_CALLS: 0, K.CODE_CALLS: 0, K.INVALID_ACTIONS: 0, K.TOOL_ERRORS: 0,
                       K.SEARCH_ERRORS: 0, K.CODE_ERRORS: 0}
        self.capped = False
        self.first_tool_turn = K.PAD
        self.answer: str | None = None
        self.transcript = ""
        self.done = False

    @property
    def is_final_turn(self) -> bool:
        return len(self.turns) >= self.cfg.max_turns

    async def step(self, action_text: str) -> StepOutcome:
        if self.done:
            raise RuntimeError("step() called after the episode ended")
        final = self.is_final_turn
        action = parse_action(action_text, self.allowed)
        record = TurnRecord(action.kind, think=think_text(action_text))
        if action.kind == SEARCH:
            record.think_sim = max_similarity(record.think, [t.think for t in self.turns if t.kind == SEARCH])
        observation = ""
        over = self._time_left() == 0.0  # the cap passed while this turn was generated
        if action.kind == ANSWER:  # the one answer rule (actions.answer_of) for reward, EM and metadata
            self.answer = action.content
        elif action.is_tool and not final and not over:
            observation = await self._run_tool(action, record, turn=len(self.turns))
        elif action.kind in (INVALID, NONE):
            self.counts[K.INVALID_ACTIONS] += 1
            if not final and not over:
                observation = corrective_observation(self.allowed)
        if over and action.kind != ANSWER and not final:
            self.capped = True  # no tool ran: the episode ends with what it has
        self.turns.append(record)
        self.transcript += action_text + observation
        self.done = final or action.kind == ANSWER or self.capped
        reward, score = self._reward() if self.done else (0.0, 0.0)
        return StepOutcome(observation, self.done, reward, score, self.metadata())

    def _time_left(self) -> float | None:
        """Seconds until the cap (0.0 once past it); None without a cap."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    async def _capped_call(self, call):
        """Await a tool call, cut at the episode's deadline (asyncio.TimeoutError then)."""
        left = self._time_left()
        return await (call if left is None else asyncio.wait_for(call, left))

    def _failed(self, error_key: str) -> None:
        self.counts[K.TOOL_ERRORS] += 1
        self.counts[error_key] += 1

    def _cap_note(self, what: str) -> str:
        self.capped = True
        return f"{what} cut: the episode reached its time cap (episode_timeout_s={self.cfg.episode_timeout_s:g})"

    async def _run_tool(self, action: Action, record: TurnRecord, turn: int) -> str:
        """Call the tool; any failure becomes the observation and a counted tool error (a call cut
        by the episode's cap too: it got no answer)."""
        self.counts[K.TOOL_CALLS] += 1
        if self.first_tool_turn == K.PAD:
            self.first_tool_turn = turn
        if action.kind == SEARCH:
            self.counts[K.SEARCH_CALLS] += 1
            try:
                docs = await self._capped_call(self.tools.search.search(action.content))
            except Exception as err:  # noqa: BLE001 - a tool failure must never kill a rollout
                self._failed(K.SEARCH_ERRORS)
                text = self._cap_note("search") if self._time_left() == 0.0 else f"search failed: {_describe(err)}"
                return information_block(text, self.truncate)
            record.doc_ids = [M.encode_doc_id(d.id) for d in docs[: self.cfg.topk]]
            return information_block(format_docs(docs), self.truncate)
        assert action.kind == CODE
        self.counts[K.CODE_CALLS] += 1
        try:
            output = await self._capped_call(self.tools.sandbox.run(action.content))
        except Exception as err:  # noqa: BLE001
            self._failed(K.CODE_ERRORS)
            text = (self._cap_note("code execution") if self._time_left() == 0.0
                    else f"code execution failed: {_describe(err)}")
            return result_block(text, self.truncate)
        return result_block(output, self.truncate)

    def _reward(self) -> tuple[float, float]:
        """(reward, score): score is the answer metric alone; reward adds format shaping if on."""
        score = METRICS[self.cfg.reward](self.answer, self.golds) if self.answer is not None else 0.0
        if not self.cfg.format_reward:
            return score, score
        coef = FormatCoefficients(self.cfg.structure_format_score, self.cfg.final_format_score,
                                  self.cfg.retrieval_score)
        return format_reward(self.transcript, self.answer, self.golds, self.cfg.reward, coef), score

    @property
    def format_ok(self) -> bool:
        """CalibAdv's authors' format check on the finished trajectory: Search-R1's structure
        (``is_valid_sequence``), at least one search, no invalid action, an answer."""
        return (self.done and self.answer is not None and self.counts[K.SEARCH_CALLS] > 0
                and self.counts[K.INVALID_ACTIONS] == 0 and is_valid_sequence(self.transcript))

    def metadata(self) -> dict[str, int | float]:
        """All contract keys (same set every call); token ranges are filled by the executor."""
        meta = M.empty_metadata(self.cfg.max_turns, self.cfg.topk)
        meta.update(self.counts)
        meta[K.TURNS] = len(self.turns)
        meta[K.ANSWERED] = int(self.answer is not None)
        meta[K.FIRST_TOOL_TURN] = self.first_tool_turn
        meta[K.FORMAT_OK] = int(self.format_ok)
        meta[K.CAPPED] = int(self.capped)
        if self.answer is not None:
            meta[K.EM] = exact_match(self.answer, self.golds)
            meta[K.F1] = token_f1(self.answer, self.golds)
        for k, turn in enumerate(self.turns[: K.max_turn_slots(self.cfg.max_turns)]):
            meta[K.turn_kind_key(k)] = K.KIND_CODES[turn.kind]
            if turn.think_sim is not None:
                meta[K.turn_think_sim_key(k)] = float(turn.think_sim)
            for j, doc in enumerate(turn.doc_ids[: self.cfg.topk]):
                meta[K.turn_doc_key(k, j)] = doc
        return meta


def _describe(err: Exception) -> str:
    text = str(err).strip()
    return text if text else type(err).__name__
