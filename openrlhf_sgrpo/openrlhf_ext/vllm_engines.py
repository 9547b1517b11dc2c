"""OpenRLHF's own vLLM engines (``create_vllm_engines`` → ``RolloutRayActor``), ended cleanly.

OpenRLHF 0.11.2's ``train()`` never shuts its engines down: ``ray.shutdown`` kills the
``RolloutRayActor`` processes, and vLLM's engine-core process, left without its parent, exits
without unlinking its shared-memory message queue, so every run leaves a ``/dev/shm/psm_*``
file behind (~160 MB with vLLM's CPU build). Our CLI therefore creates the engines through
:func:`create_vllm_engines_tracked` (upstream's function, called as is, the handles remembered)
and, once ``train()`` returns, ends each engine from inside its actor (:func:`shutdown_engines`).
"""

from __future__ import annotations

import asyncio
from typing import Any

SHUTDOWN_TIMEOUT_S = 60
_CREATED: list = []


def create_vllm_engines_tracked(*args: Any, **kwargs: Any) -> list:
    """``openrlhf.trainer.ray.create_vllm_engines`` unchanged; the engines are remembered."""
    from openrlhf.trainer.ray import create_vllm_engines

    engines = create_vllm_engines(*args, **kwargs)
    _CREATED.extend(engines)
    return engines


def _shutdown_in_rollout_actor(rollout_actor: Any, timeout_s: float) -> bool:
    """Inside a ``RolloutRayActor`` (``__ray_call__`` runs it in a thread): shut the engine down on
    its own loop, waiting for the engine-core process to exit and clean up. True if it ran."""
    llm = getattr(rollout_actor, "llm", None)
    handler = getattr(llm, "output_handler", None)
    if llm is None:
        return False

    async def shutdown() -> None:
        llm.shutdown(timeout=timeout_s)

    if handler is None:  # never generated: no loop of its own is known, call it directly
        llm.shutdown(timeout=timeout_s)
    else:
        asyncio.run_coroutine_threadsafe(shutdown(), handler.get_loop()).result(timeout_s + 30)
    rollout_actor.llm = None
    return True


def shutdown_engines(engines: list | None = None, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> int:
    """End ``engines`` (default: every engine :func:`create_vllm_engines_tracked` made) cleanly, then
    kill their actors. Returns how many shut down; an engine already gone is skipped."""
    import ray

    targets = list(_CREATED if engines is None else engines)
    done = 0
    for engine in targets:
        try:
            done += bool(ray.get(engine.__ray_call__.remote(_shutdown_in_rollout_actor, timeout_s)))
        except ray.exceptions.RayActorError:
            continue  # the actor is already dead; nothing of it is left to end
        finally:
            ray.kill(engine)
    if engines is None:
        _CREATED.clear()
    return done
