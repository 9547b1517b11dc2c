"""The OpenRLHF agent executor (what `--train.agent_func_path agent_env/openrlhf_agent.py` loads).

OpenRLHF builds `AgentExecutor()` with no arguments and a fresh `AgentInstance()` per
trajectory, so the configuration comes from the YAML named by $SGRPO_AGENT_CONFIG and the
executor hands the config, the policy tokenizer and the shared tool clients to its instances
through a context variable (visible inside `super().execute`, which runs in the same task).
"""

from __future__ import annotations

import contextvars
import functools
import time
from copy import deepcopy
from dataclasses import dataclass

import torch
from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

from agent_env import metadata as M
from agent_env.actions import STOP_STRINGS
from agent_env.config import AgentConfig, load_config
from agent_env.episode import Episode
from agent_env.observations import char_truncator, token_truncator
from agent_env.rewards import parse_golds
from agent_env.templates import build_prompt
from agent_env.tools import ToolSet, get_toolset


@dataclass(frozen=True)
class AgentContext:
    config: AgentConfig
    tokenizer: object | None
    tools: ToolSet


_CONTEXT: contextvars.ContextVar[AgentContext | None] = contextvars.ContextVar("sgrpo_agent_context", default=None)


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _default_context() -> AgentContext:
    """Used when an instance runs outside AgentExecutor.execute (config from the env var)."""
    cfg = load_config()
    tok = _load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
    return AgentContext(cfg, tok, get_toolset(cfg))


def with_agent_stops(sampling_params):
    """A copy whose stop strings include the action closers, kept in the output text.

    Only touches attributes both vLLM's SamplingParams and ours have.
    """
    params = deepcopy(sampling_params)
    stops = params.stop or []
    stops = [stops] if isinstance(stops, str) else list(stops)
    params.stop = stops + [s for s in STOP_STRINGS if s not in stops]
    params.include_stop_str_in_output = True
    return params


class TurnCappedEngine:
    """Wraps the generation engine so no single turn exceeds ``max_tokens_per_turn``.

    MultiTurnAgentExecutor resets ``max_tokens`` to the whole remaining context before every
    turn and passes a deepcopy to ``generate``, so clamping that copy here is the one place a
    per-turn budget (Search-R1's 500 tokens) can hold.
    """

    def __init__(self, engine, cap: int | None):
        self.engine, self.cap = engine, cap

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        if self.cap is not None and (sampling_params.max_tokens is None or sampling_params.max_tokens > self.cap):
            sampling_params.max_tokens = self.cap
        return await self.engine.generate(prompt_token_ids, sampling_params, multi_modal_data=multi_modal_data)

    def __getattr__(self, name):  # anything else the executor or vLLM may ask of the engine
        return getattr(self.engine, name)


class AgentInstance(AgentInstanceBase):
    """One trajectory: renders the prompt template, then runs an Episode turn by turn."""

    def __init__(self, *args, **kwargs):
        self.ctx = _CONTEXT.get() or _default_context()
        self.episode: Episode | None = None

    async def reset(self, states: dict, **kwargs):
        cfg, tok = self.ctx.config, self.ctx.tokenizer
        truncate = token_truncator(tok, cfg.max_obs_tokens) if tok is not None else char_truncator(cfg.max_obs_tokens)
        deadline = time.monotonic() + cfg.episode_timeout_s if cfg.episode_timeout_s is not None else None
        self.episode = Episode(cfg, self.ctx.tools, parse_golds(states["label"]), truncate, deadline)
        return {"observation": build_prompt(cfg.template, states["observation"], tok)}

    async def step(self, states: dict, **kwargs):
        if self.episode is None:
            raise RuntimeError("AgentInstance.step() before reset()")
        out = await self.episode.step(states["action_text"])
        return {
            "rewards": torch.tensor(out.reward, dtype=torch.float32),
            "scores": torch.tensor(out.score, dtype=torch.float32),
            "environment_feedback": out.observation,
            "done": out.done,
            "sampling_params": states.get("sampling_params"),
            "extra_logs": out.metadata,
        }


class AgentExecutor(MultiTurnAgentExecutor):
    """MultiTurnAgentExecutor plus stop strings, per-turn token ranges and action-token counts."""

    def __init__(self, config: AgentConfig | None = None):
        super().__init__(AgentInstance)
        self.config = config or load_config()

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None):
        ctx = AgentContext(self.config, hf_tokenizer, get_toolset(self.config))
        token = _CONTEXT.set(ctx)
        try:
            engine = TurnCappedEngine(llm_engine, self.config.max_tokens_per_turn)
            result = await super().execute(prompt, label, with_agent_stops(sampling_params), max_length,
                                           hf_tokenizer, engine, images)
        finally:
            _CONTEXT.reset(token)
        meta = dict(result.get("extra_logs") or M.empty_metadata(self.config.max_turns, self.config.topk))
        result["extra_logs"] = M.fill_action_ranges(meta, result["action_ranges"], self.config.max_turns, max_length)
        return result
