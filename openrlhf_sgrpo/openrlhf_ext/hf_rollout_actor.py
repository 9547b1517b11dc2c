"""OpenRLHF's rollout-engine interface served by the project's HF engine instead of vLLM.

OpenRLHF 0.11.2's ``SamplesGenerator`` talks to its engines (``RolloutRayActor``) through
``generate_responses(...)``, ``get_num_unfinished_requests()`` and, with ``--vllm.enable_sleep``,
``sleep``/``wake_up``; the agent executor inside the engine calls ``generate(...)``. This actor
offers the same methods on top of :class:`~openrlhf_sgrpo.local.hf_engine.HFGenerationEngine`
and loads the agent with OpenRLHF's own ``_load_agent_executor``, from the same
``--train.agent_func_path``. It lets the real cluster data path (Ray, ``SamplesGenerator``, our
agent and experience maker) run where vLLM cannot: CPU machines, tests, debugging.

It receives no weight updates from the trainer, so it samples from the weights it was
started with: a stand-in for the engine boundary, not a way to train.
"""

from __future__ import annotations

import asyncio
from typing import Any

from openrlhf_sgrpo.local.sampling import SamplingParams

# vLLM SamplingParams fields the HF engine understands, read by name (vLLM's or a stand-in's).
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "min_tokens", "stop", "stop_token_ids",
                    "include_stop_str_in_output", "skip_special_tokens", "logprobs", "ignore_eos", "seed")


def to_engine_params(params: Any) -> SamplingParams:
    """The HF engine's SamplingParams from vLLM's (unset fields keep the engine's defaults)."""
    values = {name: getattr(params, name) for name in _SAMPLING_FIELDS if getattr(params, name, None) is not None}
    return SamplingParams(**values)


class HFRolloutActor:
    """One engine: the policy at ``model_path`` on ``device``, the agent from ``agent_func_path``."""

    def __init__(self, model_path: str, agent_func_path: str, seed: int = 0, max_batch: int = 32,
                 device: str = "cpu") -> None:
        import torch
        from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from openrlhf_sgrpo.local.hf_engine import HFGenerationEngine

        self.executor = _load_agent_executor(agent_func_path)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.engine = HFGenerationEngine(model, tokenizer, max_batch=max_batch, device=device, seed=seed)
        self._unfinished = 0

    async def generate(self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data=None):
        """One turn, for the agent executor (``RolloutRayActor.generate``'s contract)."""
        self._unfinished += 1
        try:
            return await self.engine.generate(prompt_token_ids, to_engine_params(sampling_params), multi_modal_data)
        finally:
            self._unfinished -= 1

    async def generate_responses(self, prompt: str, label: str, sampling_params: Any, max_length: int,
                                 hf_tokenizer: Any, num_samples: int = 1, images=None) -> list[dict]:
        """``num_samples`` agent trajectories for one prompt, all in flight at once."""
        return list(await asyncio.gather(*[
            self.executor.execute(prompt=prompt, label=label, sampling_params=sampling_params, max_length=max_length,
                                  hf_tokenizer=hf_tokenizer, llm_engine=self, images=images)
            for _ in range(num_samples)]))

    def get_num_unfinished_requests(self) -> int:
        return self._unfinished

    async def sleep(self, level: int = 1) -> None:
        """Nothing to release: the HF engine holds no KV cache between batches."""

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Counterpart of :meth:`sleep`."""


def create_hf_engines(num_engines: int, model_path: str, agent_func_path: str, seed: int = 0,
                      device: str = "cpu", num_cpus: float = 1, num_gpus: float = 0) -> list:
    """Ray actors in place of ``create_vllm_engines``'s (engine ``i`` samples with ``seed + i``)."""
    import ray

    actor_cls = ray.remote(HFRolloutActor)
    return [actor_cls.options(num_cpus=num_cpus, num_gpus=num_gpus).remote(model_path, agent_func_path,
                                                                           seed=seed + i, device=device)
            for i in range(num_engines)]
