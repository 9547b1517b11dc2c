"""OpenRLHF's rollout-engine interface served by the project's HF engine instead of vLLM.

OpenRLHF 0.11.2's ``SamplesGenerator`` talks to its engines (``RolloutRayActor``) through
``generate_responses(...)``, ``get_num_unfinished_requests()`` and, with ``--vllm.enable_sleep``,
``sleep``/``wake_up``; the agent executor inside the engine calls ``generate(...)``. This actor
offers the same methods on top of :class:`~openrlhf_sgrpo.engine.hf.HFGenerationEngine`
and loads the agent with OpenRLHF's own ``_load_agent_executor``, from the same
``--train.agent_func_path``. It lets the real cluster data path (Ray, ``SamplesGenerator``, our
agent and experience maker) run where vLLM cannot: CPU machines, tests, debugging.

With ``--sgrpo.rollout_engine hf`` it replaces vLLM in a training run: OpenRLHF's
``create_vllm_engines`` is swapped for :func:`create_hf_engines_like_vllm`, and after each update
the policy actor sends the new weights through ``update_weight_cuda_ipc`` as it does to vLLM in
a colocated (hybrid-engine) run. Generation is plain batched ``transformers`` sampling, far slower
than vLLM: for machines where vLLM does not install, and for checking the pipeline.
"""

from __future__ import annotations

import asyncio
from typing import Any

from openrlhf_sgrpo.engine.sampling import SamplingParams

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

        from openrlhf_sgrpo.engine.hf import HFGenerationEngine

        self.executor = _load_agent_executor(agent_func_path)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32  # vLLM's engines run bf16
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        self.engine = HFGenerationEngine(model, tokenizer, max_batch=max_batch, device=device, seed=seed)
        self._unfinished = 0
        self.weights_loaded = 0

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

    def reset_prefix_cache(self) -> None:
        """No prefix cache to drop (called with ``--vllm.enable_prefix_caching``)."""

    def load_weight(self, name: str, weight: Any) -> None:
        """Copy the trainer's tensor ``name`` into the engine's model (cast to its dtype)."""
        import torch

        param = self.engine.model.get_parameter(name)  # AttributeError names an unknown weight
        if tuple(param.shape) != tuple(weight.shape):
            raise ValueError(f"weight {name}: trainer shape {tuple(weight.shape)}, engine {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(weight)
        self.weights_loaded += 1

    def update_weight_cuda_ipc(self, name: str, dtype: Any, shape: Any, ipc_handles: dict | None = None,
                               empty_cache: bool = False) -> None:
        """vLLM's ``WorkerWrap.update_weight_cuda_ipc``: open the trainer's CUDA IPC handle for this
        GPU (matched by UUID, the device index rewritten to ours) and load the tensor."""
        import torch
        from openrlhf.trainer.ray.utils import get_physical_gpu_id

        rebuild, args = ipc_handles[get_physical_gpu_id()]
        args = list(args)
        args[6] = torch.cuda.current_device()  # the handle carries the sender's device index
        self.load_weight(name, rebuild(*args))
        torch.cuda.synchronize()
        if empty_cache:  # OpenRLHF sets it on the last tensor of a sync
            torch.cuda.empty_cache()
            print(f"HFRolloutActor: weights synced from the trainer ({self.weights_loaded} tensors loaded so far)",
                  flush=True)

    def update_weight(self, name: str, dtype: Any, shape: Any, empty_cache: bool = False) -> None:
        raise NotImplementedError("the HF rollout engine takes weights over CUDA IPC only: run with "
                                  "--train.colocate_all (and without --train.async_enable)")


def create_hf_engines(num_engines: int, model_path: str, agent_func_path: str, seed: int = 0,
                      device: str = "cpu", num_cpus: float = 1, num_gpus: float = 0, placement_group=None) -> list:
    """Ray actors in place of ``create_vllm_engines``'s (engine ``i`` samples with ``seed + i``; with
    ``placement_group``, engine ``i`` sits in its bundle ``i``, as vLLM's engines do)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    actor_cls = ray.remote(HFRolloutActor)
    engines = []
    for i in range(num_engines):
        options = {"num_cpus": num_cpus, "num_gpus": num_gpus}
        if placement_group is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=placement_group, placement_group_capture_child_tasks=True,
                placement_group_bundle_index=i)
        engines.append(actor_cls.options(**options).remote(model_path, agent_func_path, seed=seed + i, device=device))
    return engines


def create_hf_engines_like_vllm(num_engines: int, tensor_parallel_size: int, pretrain: str, seed: int,
                                full_determinism: bool, enable_prefix_caching: bool, enforce_eager: bool,
                                max_model_len: int, shared_pg=None, gpu_memory_utilization: float | None = None,
                                vllm_enable_sleep: bool = False, logprobs_mode: str | None = None,
                                agent_func_path: str | None = None, remote_rm_url: str | None = None,
                                max_images_per_prompt: int = 0) -> list:
    """OpenRLHF 0.11.2's ``create_vllm_engines`` signature (its ``train()`` passes the first nine
    positionally): one GPU engine per bundle of the colocated placement group. Options only vLLM
    has (prefix caching, eager mode, memory share, sleep) have nothing to act on and are ignored."""
    if shared_pg is None or tensor_parallel_size != 1 or not agent_func_path:
        raise ValueError("--sgrpo.rollout_engine hf needs --train.colocate_all (not async), "
                         "--vllm.tensor_parallel_size 1 and --train.agent_func_path")
    if logprobs_mode or max_images_per_prompt:
        raise ValueError("--sgrpo.rollout_engine hf returns no rollout log-probs and takes no images: "
                         "leave --algo.advantage.is_correction_level off and images out")
    # 0.2 GPU of the bundle, as OpenRLHF gives a hybrid engine; the rest of the GPU is the trainer's
    return create_hf_engines(num_engines, pretrain, agent_func_path, seed=seed, device="cuda", num_cpus=0.2,
                             num_gpus=0.2, placement_group=shared_pg)
