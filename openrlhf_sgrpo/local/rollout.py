"""Run the agent over prompts on one machine: OpenRLHF's executor + our agent + the HF engine.

``agent_env.openrlhf_agent.AgentExecutor`` (a ``MultiTurnAgentExecutor``) is the code the
cluster run loads with ``--train.agent_func_path``; here it is awaited for every (prompt,
sample) at once on one asyncio loop, against :class:`~openrlhf_sgrpo.engine.hf.
HFGenerationEngine`, which batches the concurrent ``generate`` calls. Thin proxies add interval
timing of generate and tool calls; the per-turn token cap is the agent's own
(``AgentConfig.max_tokens_per_turn``). A :data:`~openrlhf_sgrpo.local.scripted.FirstTurnScript`
may fix the first turn of chosen sample slots of every training group (see :mod:`.scripted`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from agent_env import info_keys as K
from agent_env.config import AgentConfig
from agent_env.openrlhf_agent import AgentExecutor
from agent_env.tools import get_toolset
from openrlhf_sgrpo.engine.sampling import SamplingParams
from openrlhf_sgrpo.local.experience import Sample, tensorize_response
from openrlhf_sgrpo.local.heap import release_freed_memory
from openrlhf_sgrpo.local.scripted import FirstTurnForced, FirstTurnScript
from openrlhf_sgrpo.local.timing import IntervalRecorder, rollout_timing


class TimedEngine:
    """``generate`` with a recorded interval per call."""

    def __init__(self, engine, recorder: IntervalRecorder):
        self.engine, self.recorder = engine, recorder

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        start = time.monotonic()
        try:
            return await self.engine.generate(prompt_token_ids, sampling_params, multi_modal_data=multi_modal_data)
        finally:
            self.recorder.add("generate", start, time.monotonic())


def call_seed(*parts: int) -> int:
    """A 31-bit sampling seed from integers (a run's seed, a trajectory, a call), stable across
    processes and Python versions (``hash`` of a tuple is not)."""
    digest = hashlib.blake2b(",".join(map(str, parts)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") >> 1


class SeededCalls:
    """The engine as one sampled trajectory sees it: its k-th ``generate`` samples with seed
    ``call_seed(seed, k)``.

    Unseeded, vLLM (and the HF engine) draw every request's tokens from one engine-wide generator
    in the order they are batched, and tool latencies change that order from run to run: two
    ``make demo`` runs of the same computation on one machine agreed for two RL steps, then parted
    (held-out two-hop EM after RL 0.25 and 0.54). A seed per call gives each trajectory draws of its
    own, so a seeded run samples the same tokens whatever the batching (while the logits agree)."""

    def __init__(self, engine, seed: int):
        self.engine, self.seed, self.calls = engine, seed, 0

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        # the executor passes (copies of) AgentRollout's own SamplingParams, a dataclass
        params = dataclasses.replace(sampling_params, seed=call_seed(self.seed, self.calls))
        self.calls += 1
        return await self.engine.generate(prompt_token_ids, params, multi_modal_data=multi_modal_data)


class TimedTool:
    """Wraps a tool client; records the interval of each ``search`` / ``run`` call."""

    def __init__(self, client, kind: str, method: str, recorder: IntervalRecorder):
        self._client, self._kind, self._method, self._recorder = client, kind, method, recorder

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if name != self._method:
            return attr

        async def timed(*args, **kwargs):
            start = time.monotonic()
            try:
                return await attr(*args, **kwargs)
            finally:
                self._recorder.add(self._kind, start, time.monotonic())
        return timed


def _unwrap(client):
    """The tool client itself, if an earlier rollout on the same ToolSet already wrapped it."""
    return client._client if isinstance(client, TimedTool) else client


@dataclass
class RolloutResult:
    samples: list[Sample]  # prompt-contiguous: n per prompt
    timing: dict = field(default_factory=dict)


def label_of(golds: list[str]) -> str:
    """The dataset label the agent parses (``agent_env.rewards.parse_golds``): a JSON list."""
    return json.dumps([str(g) for g in golds])


class _Progress:
    """A tqdm bar over trajectories with running mean reward, EM and tool calls."""

    def __init__(self, total: int, desc: str, enabled: bool, initial: int = 0):
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit="traj", disable=not enabled,
                        dynamic_ncols=True)
        self.done, self.reward, self.em, self.tools = 0, 0.0, 0.0, 0.0

    def add(self, out: dict) -> None:
        logs = out.get("extra_logs") or {}
        self.reward += float(out.get("reward") or 0.0)
        self.em += float(logs.get(K.EM, 0.0))
        self.tools += float(logs.get(K.TOOL_CALLS, 0.0))
        self.done += 1
        self.bar.update(1)
        self.bar.set_postfix(reward=f"{self.reward / self.done:.2f}", em=f"{self.em / self.done:.2f}",
                             tools=f"{self.tools / self.done:.2f}", refresh=False)

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()


class AgentRollout:
    """Owns one event loop, the executor and the instrumented engine/tools."""

    def __init__(self, engine, tokenizer, agent_config: AgentConfig, max_len: int,
                 max_tokens_per_turn: int | None = 64, temperature: float = 1.0, top_p: float = 1.0,
                 first_turn_script: FirstTurnScript | None = None):
        """``max_tokens_per_turn`` overrides the agent config's cap (None keeps the config's);
        ``first_turn_script`` applies to :meth:`run` (training groups), never to evaluation."""
        self.tokenizer, self.max_len = tokenizer, max_len
        self.temperature, self.top_p = temperature, top_p
        self.first_turn_script = first_turn_script
        self.recorder = IntervalRecorder()
        self.engine = TimedEngine(engine, self.recorder)
        if max_tokens_per_turn is not None:
            agent_config = dataclasses.replace(agent_config, max_tokens_per_turn=max_tokens_per_turn)
        self.executor = AgentExecutor(agent_config)
        tools = get_toolset(agent_config)  # the process-wide ToolSet the executor will use
        tools.search = TimedTool(_unwrap(tools.search), "search", "search", self.recorder)
        tools.sandbox = TimedTool(_unwrap(tools.sandbox), "code", "run", self.recorder)
        self.tools = tools
        self.loop = asyncio.new_event_loop()

    def sync_weights(self, model) -> float:
        """Give the engine ``model``'s current weights (a no-op for the HF engine, which generates
        with the model itself); returns the seconds it took."""
        start = time.monotonic()
        self.engine.engine.sync_weights(model)
        return time.monotonic() - start

    def run(self, prompts: list[str], golds: list[list[str]], n: int = 1, greedy: bool = False,
            desc: str = "rollout", progress: bool = True, seed: int | None = None) -> RolloutResult:
        """``n`` trajectories per prompt, all in flight at once; samples come back prompt-contiguous.
        With a ``seed``, trajectory j's engine calls sample with seeds derived from (seed, j)
        (:class:`SeededCalls`): the same seed gives the same draws whatever the batching."""
        if len(prompts) != len(golds):
            raise ValueError(f"{len(prompts)} prompts but {len(golds)} gold lists")
        self.recorder.clear()
        release_freed_memory()
        start = time.monotonic()
        jobs = [(p, g, self._script(k, p, g)) for p, g in zip(prompts, golds) for k in range(n)]
        responses = self.loop.run_until_complete(self._run_all(jobs, greedy, desc, progress, seed))
        wall = time.monotonic() - start
        release_freed_memory()
        samples = [tensorize_response(r, self.max_len) for r in responses]
        for sample, (_, _, script) in zip(samples, jobs):
            sample.scripted = script is not None
        return RolloutResult(samples, rollout_timing(self.recorder, wall))

    def _script(self, slot: int, prompt: str, golds: list[str]) -> str | None:
        return self.first_turn_script(slot, prompt, golds) if self.first_turn_script is not None else None

    def _params(self, greedy: bool) -> SamplingParams:
        return SamplingParams(temperature=0.0 if greedy else self.temperature, top_p=1.0 if greedy else self.top_p,
                              max_tokens=None)

    def run_each(self, prompts: list[str], golds: list[list[str]], concurrency: int,
                 on_done: Callable[[int, Sample], None], greedy: bool = True, desc: str = "rollout",
                 progress: bool = True, done_before: int = 0) -> dict:
        """One trajectory per prompt, at most ``concurrency`` in flight, a new one started as each
        ends (no batch waits for its slowest member); ``on_done(i, sample)`` runs as trajectory
        ``i`` finishes. ``done_before`` starts the progress bar there (a resumed job). Returns the
        timing of the whole run."""
        if len(prompts) != len(golds):
            raise ValueError(f"{len(prompts)} prompts but {len(golds)} gold lists")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.recorder.clear()
        release_freed_memory()
        start = time.monotonic()

        async def main() -> None:
            gate = asyncio.Semaphore(concurrency)
            with _Progress(len(prompts) + done_before, desc, progress, initial=done_before) as bar:
                async def one(i: int) -> None:
                    async with gate:
                        out = await self._execute(prompts[i], label_of(golds[i]), greedy)
                    bar.add(out)
                    on_done(i, tensorize_response(out, self.max_len))

                await asyncio.gather(*(one(i) for i in range(len(prompts))))

        self.loop.run_until_complete(main())
        timing = rollout_timing(self.recorder, time.monotonic() - start)
        release_freed_memory()
        return timing

    async def _execute(self, prompt: str, label: str, greedy: bool, script: str | None = None,
                       seed: int | None = None) -> dict:
        engine = self.engine if seed is None or greedy else SeededCalls(self.engine, seed)
        engine = engine if script is None else FirstTurnForced(engine, self.tokenizer, script)
        return await self.executor.execute(prompt, label, self._params(greedy), self.max_len, self.tokenizer, engine)

    async def _run_all(self, jobs: list[tuple[str, list[str], str | None]], greedy: bool, desc: str,
                       progress: bool, seed: int | None) -> list[dict]:
        with _Progress(len(jobs), desc, progress) as bar:
            async def one(j: int, prompt: str, golds: list[str], script: str | None) -> dict:
                job_seed = None if seed is None else call_seed(seed, j)
                out = await self._execute(prompt, label_of(golds), greedy, script, job_seed)
                bar.add(out)
                return out

            return list(await asyncio.gather(*(one(j, *job) for j, job in enumerate(jobs))))

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.run_until_complete(self.tools.close())
        self.loop.close()
