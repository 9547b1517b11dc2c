"""vLLM behind the engine contract the agent executor calls, for evaluation on a GPU.

The calls mirror OpenRLHF 0.11.2's own `RolloutRayActor.generate` (`vllm.AsyncEngineArgs`,
`AsyncLLMEngine.from_engine_args`, `TokensPrompt`, one request id per call), so a model is served
exactly as in the cluster rollout. vLLM's engine binds to the event loop it first runs on, while
our callers (`AgentRollout`) each own a loop; so the engine lives on a private loop thread and
`generate` hops there and back. vLLM is only imported when this engine is built: the CPU install
has no vLLM, and `python -m openrlhf_sgrpo.eval --engine vllm` then says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import uuid

from openrlhf_sgrpo.local.sampling import SamplingParams


class VLLMUnavailable(RuntimeError):
    """vLLM is not installed (it needs a CUDA machine: `pip install -r requirements-gpu.txt`)."""


def import_vllm():
    try:
        import vllm
        from vllm.inputs import TokensPrompt
    except ImportError as err:
        raise VLLMUnavailable(f"--engine vllm needs vLLM, which is not importable here ({err}); install "
                              "requirements-gpu.txt on a CUDA machine, or use --engine hf") from err
    return vllm, TokensPrompt


def to_vllm_params(vllm, params):
    """Our SamplingParams (same field names as vLLM's) as a fresh vllm.SamplingParams."""
    if isinstance(params, SamplingParams):
        return vllm.SamplingParams(**dataclasses.asdict(params))
    return params.clone() if hasattr(params, "clone") else params


class VLLMGenerationEngine:
    """`await generate(prompt_token_ids, sampling_params)` -> vLLM RequestOutput, from any loop."""

    def __init__(self, model_path: str, seed: int = 0, gpu_memory_utilization: float = 0.85,
                 max_model_len: int | None = None, dtype: str = "auto", **engine_kwargs) -> None:
        self._vllm, self._tokens_prompt = import_vllm()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine", daemon=True)
        self._thread.start()
        args = self._vllm.AsyncEngineArgs(model=model_path, seed=seed, dtype=dtype, max_model_len=max_model_len,
                                          gpu_memory_utilization=gpu_memory_utilization, **engine_kwargs)

        async def build():
            return self._vllm.AsyncLLMEngine.from_engine_args(args)

        try:
            self.llm = asyncio.run_coroutine_threadsafe(build(), self._loop).result()
        except BaseException:
            self._stop_loop()
            raise

    async def _generate(self, prompt_token_ids: list[int], params):
        final = None
        async for out in self.llm.generate(self._tokens_prompt(prompt_token_ids=list(prompt_token_ids)),
                                           to_vllm_params(self._vllm, params), request_id=uuid.uuid4().hex):
            final = out
        return final

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        if multi_modal_data:
            raise ValueError("the evaluation engine takes text prompts only")
        future = asyncio.run_coroutine_threadsafe(self._generate(prompt_token_ids, sampling_params), self._loop)
        return await asyncio.wrap_future(future)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def close(self) -> None:
        shutdown = getattr(getattr(self, "llm", None), "shutdown", None)
        if shutdown is not None:
            self._loop.call_soon_threadsafe(shutdown)
        self._stop_loop()
