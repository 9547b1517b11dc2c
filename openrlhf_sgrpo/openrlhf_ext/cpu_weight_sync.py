"""The policy's weights into OpenRLHF's vLLM engines when there is no CUDA (vLLM's CPU build).

OpenRLHF 0.11.2's ``ActorPPOTrainer.broadcast_to_vllm`` has two paths, CUDA IPC and a
NCCL/gloo group whose receiving side allocates on ``cuda``; a CPU has neither. This module adds
the smallest third path and puts it behind the trainer's own call: in the policy actor's process
:func:`install_cpu_weight_sync` wraps ``broadcast_to_vllm`` (and skips the sync group's set-up,
which the file path does not need) so that, only when CUDA is absent,
the weights go through :mod:`openrlhf_sgrpo.engine.weight_sync` (one safetensors file in
``/dev/shm``, reloaded in place by every vLLM worker). With CUDA the upstream method runs
untouched.

The engines are OpenRLHF's own ``RolloutRayActor``s, which expose no method for this; Ray's
``__ray_call__`` runs a function inside the actor. On an async actor it runs in a thread
without the actor's event loop, so the function hands the reload coroutine to the loop the
engine's output handler runs on (the loop ``RolloutRayActor.__init__`` built the engine in).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

_PATCH_MARK = "_sgrpo_cpu_weight_sync"
RELOAD_TIMEOUT_S = 600


def _engine_loop(rollout_actor: Any) -> asyncio.AbstractEventLoop:
    handler = getattr(rollout_actor.llm, "output_handler", None)
    if handler is None:
        raise RuntimeError("the vLLM engine has no running output handler: it was not built inside the "
                           "actor's event loop (RolloutRayActor.__init__), so its loop is unknown")
    return handler.get_loop()


def reload_in_rollout_actor(rollout_actor: Any, path: str, reset_prefix_cache: bool = True) -> int:
    """Inside a ``RolloutRayActor`` (via ``__ray_call__``): every vLLM worker reloads ``path``.
    Returns the tensors each worker loaded (the smallest count, should the workers differ)."""
    from openrlhf_sgrpo.engine.weight_sync import reload_worker_weights

    llm = rollout_actor.llm

    async def reload() -> int:
        counts = await llm.collective_rpc(reload_worker_weights, args=(path,))
        if reset_prefix_cache:  # cached prefixes hold KV computed with the old weights
            await llm.reset_prefix_cache()
        return min(counts)

    return asyncio.run_coroutine_threadsafe(reload(), _engine_loop(rollout_actor)).result(RELOAD_TIMEOUT_S)


def broadcast_to_engines_via_shm(model: Any, engines: list) -> int:
    """Write ``model``'s parameters once, have every engine reload them, remove the file; raises
    where an engine read fewer tensors than the model has."""
    import ray

    from openrlhf_sgrpo.engine.weight_sync import sync_via_file

    return sync_via_file(model, lambda path: ray.get([engine.__ray_call__.remote(reload_in_rollout_actor, path)
                                                       for engine in engines]))


def _wrap_broadcast(broadcast):
    @functools.wraps(broadcast)
    def broadcast_to_vllm(self) -> None:
        import torch

        if torch.cuda.is_available():
            return broadcast(self)
        # one process holds the whole model on a CPU run (no ZeRO-3 / TP gathering to do)
        broadcast_to_engines_via_shm(self.actor.model.module, self.vllm_engines)
        return None
    return broadcast_to_vllm


def _wrap_init_sync_group(init_group):
    @functools.wraps(init_group)
    def _init_vllm_sync_group(self, backend: str) -> None:
        import torch

        if torch.cuda.is_available():
            return init_group(self, backend)
        return None  # the shared-memory path needs no process group (upstream's would allocate on cuda)
    return _init_vllm_sync_group


def install_cpu_weight_sync() -> None:
    """Wrap ``ActorPPOTrainer.broadcast_to_vllm`` and its sync-group set-up in this process (idempotent)."""
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    if getattr(ActorPPOTrainer, _PATCH_MARK, False):
        return
    ActorPPOTrainer.broadcast_to_vllm = _wrap_broadcast(ActorPPOTrainer.broadcast_to_vllm)
    ActorPPOTrainer._init_vllm_sync_group = _wrap_init_sync_group(ActorPPOTrainer._init_vllm_sync_group)
    setattr(ActorPPOTrainer, _PATCH_MARK, True)
