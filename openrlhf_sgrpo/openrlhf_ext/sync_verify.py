"""``--sgrpo.verify_weight_sync N``: after a weight sync, check by value that every vLLM engine
holds the trainer's weights.

Why: OpenRLHF's ``ActorPPOTrainer.broadcast_to_vllm`` (CUDA IPC when colocated, else NCCL; our
shared-memory file on a CPU, :mod:`openrlhf_sgrpo.openrlhf_ext.cpu_weight_sync`) reports nothing
about what arrived: vLLM logs weights a load did not get and keeps their old values, and a run
then trains against a partly stale engine with every monitor looking plausible (our own engine's
sync once dropped 10-20 % of the tensors on CUDA, ``engine/weight_sync.py``). So in the policy
actor's process :func:`install_sync_verify` wraps ``broadcast_to_vllm`` (whichever path runs
underneath): the sync runs, then, for the syncs the flag selects, each engine digests what it holds
(:func:`openrlhf_sgrpo.engine.weight_check.worker_weight_digests`, on the engine's device) and the
trainer digests its own tensors in the engine's form; only integers cross Ray. A difference raises
``RuntimeError`` naming up to 10 tensors, which ends the run where it went wrong.

When it runs: OpenRLHF's driver wakes the engines' weights (``--vllm.enable_sleep``:
``wake_up(tags=["weights"])``) before it asks the policy actors to broadcast and keeps them in that
state afterwards, so the engines hold their weights during the check. Under ZeRO-3 every rank
gathers each parameter group with the same collective upstream's broadcast uses; only rank 0 digests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from openrlhf_sgrpo.engine.weight_check import (
    as_engine_holds,
    differing,
    digest_parts,
    dtype_of,
    engine_sources,
    vocab_padding,
    worker_weight_digests,
)

_PATCH_MARK = "_sgrpo_sync_verify"
_COUNT_ATTR = "_sgrpo_syncs_done"
RESULT_ATTR = "_sgrpo_last_sync_check"  # the last check's SyncCheck, on the trainer (tests read it)
LOG_PREFIX = "[sgrpo] weight sync"  # scripts/gpu_smoke.py greps the run's log for these lines
MAX_NAMED = 10
ENGINE_TIMEOUT_S = 600


@dataclass
class EngineCheck:
    """What one engine holds, compared: tensors equal, unreadable (repacked by vLLM's CPU build), differing."""

    equal: int
    unreadable: int
    differing: list[str] = field(default_factory=list)


@dataclass
class SyncCheck:
    sync: int
    engines: list[EngineCheck]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(not e.differing for e in self.engines)

    def summary(self) -> str:
        if self.ok:
            parts = "; ".join(f"engine {i}: {e.equal} tensors equal ({e.unreadable} unreadable)"
                              for i, e in enumerate(self.engines))
            return f"{LOG_PREFIX} {self.sync} verified: {parts} in {self.seconds:.2f} s"
        bad = [(i, e) for i, e in enumerate(self.engines) if e.differing]
        named = "; ".join(f"engine {i}: {len(e.differing)} of {len(e.differing) + e.equal} readable tensors "
                          f"differ: {', '.join(e.differing[:MAX_NAMED])}{' ...' if len(e.differing) > MAX_NAMED else ''}"
                          for i, e in bad)
        return f"{LOG_PREFIX} {self.sync} FAILED verification: {named}"


def sync_is_checked(setting: int, sync: int) -> bool:
    """``--sgrpo.verify_weight_sync``: 0 off, N > 0 the first N syncs (1-based), -1 every sync."""
    return setting == -1 or 0 < sync <= setting


# ------------------------------------------------------------------------------ engine side

def digests_in_rollout_actor(rollout_actor: Any) -> list[dict]:
    """Inside OpenRLHF's ``RolloutRayActor`` (``__ray_call__``): each vLLM worker's digests, on the
    loop the engine runs on (``__ray_call__`` on an async actor runs outside it)."""
    from openrlhf_sgrpo.openrlhf_ext.cpu_weight_sync import _engine_loop

    llm = rollout_actor.llm

    async def collect() -> list[dict]:
        return await llm.collective_rpc(worker_weight_digests)

    return asyncio.run_coroutine_threadsafe(collect(), _engine_loop(rollout_actor)).result(ENGINE_TIMEOUT_S)


def engine_reports(engines: list) -> list[dict]:
    """One report per engine (its only worker's: with tensor parallelism a worker holds shards,
    which ``--sgrpo.verify_weight_sync`` refuses at parse time)."""
    import ray

    reports = []
    for i, workers in enumerate(ray.get([e.__ray_call__.remote(digests_in_rollout_actor) for e in engines])):
        if len(workers) != 1:
            raise RuntimeError(f"{LOG_PREFIX} check: engine {i} has {len(workers)} workers holding shards; "
                               "the check compares whole tensors (--vllm.tensor_parallel_size 1)")
        reports.append(workers[0])
    return reports


# ----------------------------------------------------------------------------- trainer side

def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _gather_ctx(args: Any, model: torch.nn.Module, params: list) -> contextlib.AbstractContextManager:
    """The gathering upstream's broadcast uses (ZeRO-3 partitions, DeepSpeed AutoTP splits), for a
    whole group at once; nothing to gather otherwise (and no DeepSpeed import on the CPU path)."""
    ds = getattr(args, "ds", None)
    if getattr(ds, "tensor_parallel_size", 1) > 1:
        import deepspeed

        return deepspeed.module_inject.layers.GatherReplacedLayerParams(params, model, enabled=True)
    if getattr(ds, "zero_stage", 0) == 3:
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, enabled=True)
    return contextlib.nullcontext()


def trainer_digests(model: torch.nn.Module, wanted: dict[str, set[tuple]], args: Any, digest: bool) -> dict:
    """``{(vLLM name, engine shape, engine dtype): (shape, dtype, digest)}`` of the
    trainer's tensors in each engine form in ``wanted`` (keyed by vLLM name). Every rank runs the
    same gathers in the same order (they are collectives); only a rank with ``digest`` computes."""
    params = dict(model.named_parameters())
    out = {}
    with torch.no_grad():
        for vllm_name, sources in engine_sources(list(params)).items():
            group = [params[n] for n in sources]
            with _gather_ctx(args, model, group):
                if not digest:
                    continue
                for form in wanted.get(vllm_name, ()):
                    engine_shape, engine_dtype = form
                    parts = [as_engine_holds(p.data, dtype_of(engine_dtype)) for p in group]
                    rows = sum(p.shape[0] for p in parts) if parts[0].dim() else 0
                    pad = vocab_padding(vllm_name, engine_shape, rows)
                    if pad:  # vLLM pads the vocabulary with zero rows
                        parts.append(parts[-1].new_zeros((pad, *parts[-1].shape[1:])))
                    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:]) if parts[0].dim() else ()
                    out[(vllm_name, *form)] = (shape, engine_dtype, digest_parts(parts))
    return out


def wanted_forms(reports: list[dict]) -> dict[str, set[tuple]]:
    """Every ``(engine shape, engine dtype)`` the engines hold each vLLM name in."""
    wanted: dict[str, set[tuple]] = {}
    for report in reports:
        for name, (shape, dtype, _) in report["tensors"].items():
            wanted.setdefault(name, set()).add((tuple(shape), dtype))
    return wanted


def compare_reports(reports: list[dict], ours: dict) -> list[EngineCheck]:
    """Each engine's report (:func:`worker_weight_digests`) against the trainer's digests in the
    same forms (:func:`trainer_digests`)."""
    checks = []
    for report in reports:
        mine = {name: ours[(name, tuple(shape), dtype)]
                for name, (shape, dtype, _) in report["tensors"].items()
                if (name, tuple(shape), dtype) in ours}
        bad = differing(report["tensors"], mine)
        checks.append(EngineCheck(equal=len(report["tensors"]) - len(bad), unreadable=len(report["unreadable"]),
                                  differing=bad))
    return checks


def check_engines(model: torch.nn.Module, engines: list, args: Any, sync: int) -> SyncCheck | None:
    """Compare what every engine holds with ``model`` (the trainer's whole model, or its ZeRO-3
    partitions on this rank). Collective over the trainer's ranks; rank 0 returns the result, the
    other ranks None."""
    start = time.perf_counter()
    rank0 = _rank() == 0
    reports = engine_reports(engines) if rank0 else []
    ours = trainer_digests(model, wanted_forms(reports), args, digest=rank0)
    if not rank0:
        return None
    return SyncCheck(sync=sync, engines=compare_reports(reports, ours), seconds=time.perf_counter() - start)


def _agree(check: SyncCheck | None) -> str | None:
    """Rank 0's failure message on every rank (so every rank raises, not rank 0 alone)."""
    import torch.distributed as dist

    message = None if check is None or check.ok else check.summary()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [message]
        dist.broadcast_object_list(box, src=0)
        message = box[0]
    return message


def verify_trainer_sync(trainer: Any, sync: int) -> SyncCheck | None:
    """The check of one ``ActorPPOTrainer`` sync: rank 0 logs the verified line and keeps the
    result on the trainer; every rank raises RuntimeError if an engine differs."""
    check = check_engines(trainer.actor.model.module, trainer.vllm_engines, trainer.strategy.args, sync)
    if check is not None:
        setattr(trainer, RESULT_ATTR, check)
    failure = _agree(check)
    if failure is not None:
        raise RuntimeError(failure)
    if check is not None:
        print(check.summary(), flush=True)
    return check


def _setting(trainer: Any) -> int:
    sgrpo = getattr(getattr(trainer.strategy, "args", None), "sgrpo", None)
    return int(getattr(sgrpo, "verify_weight_sync", 0) or 0)


def _wrap_broadcast(broadcast):
    @functools.wraps(broadcast)
    def broadcast_to_vllm(self) -> None:
        result = broadcast(self)
        sync = getattr(self, _COUNT_ATTR, 0) + 1
        setattr(self, _COUNT_ATTR, sync)
        if self.vllm_engines and sync_is_checked(_setting(self), sync):
            verify_trainer_sync(self, sync)
        return result
    return broadcast_to_vllm


def install_sync_verify() -> None:
    """Wrap ``ActorPPOTrainer.broadcast_to_vllm`` in this process (idempotent). Installed after
    :func:`~openrlhf_sgrpo.openrlhf_ext.cpu_weight_sync.install_cpu_weight_sync`, so it checks
    whichever sync ran: upstream's on CUDA, the shared-memory file without."""
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    if getattr(ActorPPOTrainer, _PATCH_MARK, False):
        return
    ActorPPOTrainer.broadcast_to_vllm = _wrap_broadcast(ActorPPOTrainer.broadcast_to_vllm)
    setattr(ActorPPOTrainer, _PATCH_MARK, True)
