"""Our Ray actor classes, put where OpenRLHF's ``train()`` looks them up — in the driver only.

Why no Ray ``worker_process_setup_hook``: Ray runs that hook when a worker process starts,
*before* it sets ``CUDA_VISIBLE_DEVICES`` for the actor the worker will host. OpenRLHF's
trainer modules import DeepSpeed, whose accelerator check calls ``torch.cuda.device_count()``;
run there, it fixes the devices the process sees, OpenRLHF then picks local rank 0 and every
rank of an 8-GPU node lands on GPU 0. So nothing of ours runs at worker start. Instead
:func:`install_actor_classes` (called by our CLI in the driver) replaces the classes
``openrlhf.cli.train_ppo_ray.train`` looks up with the subclasses below. Ray pickles them by
reference, so a worker imports this module while it constructs the actor, after GPU
assignment, exactly like OpenRLHF's own classes.

- sync ``PPOTrainer`` and the async ``TrainingActor``: build :class:`StratifiedExperienceMaker`
  instead of upstream's ``RemoteExperienceMaker`` (same arguments).
- ``PPOTrainerAsync``: runs in its own actor process and builds ``TrainingActor.remote(...)``
  from its module's globals, so it points that name at ours, in that process, first.
- ``PolicyModelActor``: wraps ``ActorPPOTrainer`` with SAPO in its own process (inert unless
  ``--algo.sapo.enable``) and with the CPU weight sync to vLLM (inert where CUDA exists,
  :mod:`openrlhf_sgrpo.openrlhf_ext.cpu_weight_sync`) and the by-value check of the syncs
  ``--sgrpo.verify_weight_sync`` selects (:mod:`openrlhf_sgrpo.openrlhf_ext.sync_verify`), and makes
  its DeepSpeed config carry ``--sgrpo.optimizer`` (:mod:`openrlhf_sgrpo.openrlhf_ext.torch_adam`).
"""

from __future__ import annotations

import ray
from openrlhf.trainer import ppo_trainer, ppo_trainer_async
from openrlhf.trainer.ray import ppo_actor

from openrlhf_sgrpo.openrlhf_ext.cpu_weight_sync import install_cpu_weight_sync
from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker
from openrlhf_sgrpo.openrlhf_ext.sapo_actor import install_sapo_patch
from openrlhf_sgrpo.openrlhf_ext.sync_verify import install_sync_verify
from openrlhf_sgrpo.openrlhf_ext.torch_adam import install_optimizer_choice


def _plain(actor_cls):
    """The class under an ``@ray.remote`` decorator."""
    return actor_cls.__ray_actor_class__


def _remote_like(upstream_actor, impl: type):
    """``ray.remote(impl)`` with the upstream actor's default options (``num_gpus=1`` for models)."""
    options = getattr(upstream_actor, "_default_options", None) or {}
    return ray.remote(**options)(impl) if options else ray.remote(impl)


class _StratifiedMakerMixin:
    """After ``BasePPOTrainer.__init__``: the same experience maker, with our estimators."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.experience_maker = StratifiedExperienceMaker(
            self.actor_model_group, self.critic_model_group, self.reward_model_group,
            self.reference_model_group, self.kl_ctl, self.strategy, self.tokenizer)


class SGRPOPPOTrainerImpl(_StratifiedMakerMixin, _plain(ppo_trainer.PPOTrainer)):
    """OpenRLHF's synchronous single-controller trainer with our experience maker."""


class SGRPOTrainingActorImpl(_StratifiedMakerMixin, _plain(ppo_trainer_async.TrainingActor)):
    """The training half of OpenRLHF's async trainer with our experience maker."""

    def broadcast_to_vllm(self) -> None:
        """Upstream's, reached through our class. Ray ships an actor class by value with a wrapper
        around every method it finds; an inherited upstream method travels as a copy whose
        zero-argument ``super()`` names a copy of ``TrainingActor``, which our class (imported in
        the worker) does not derive from: TypeError at the first weight sync of every async run.
        Defined here, the method travels by reference and ``super()`` is the worker's own."""
        super().broadcast_to_vllm()


SGRPOPPOTrainer = _remote_like(ppo_trainer.PPOTrainer, SGRPOPPOTrainerImpl)
SGRPOTrainingActor = _remote_like(ppo_trainer_async.TrainingActor, SGRPOTrainingActorImpl)


class SGRPOPPOTrainerAsyncImpl(_plain(ppo_trainer_async.PPOTrainerAsync)):
    """OpenRLHF's async trainer, building our training actor (this process hosts only this actor)."""

    def __init__(self, *args, **kwargs) -> None:
        ppo_trainer_async.TrainingActor = SGRPOTrainingActor
        super().__init__(*args, **kwargs)


class SGRPOPolicyModelActorImpl(_plain(ppo_actor.PolicyModelActor)):
    """OpenRLHF's policy actor; its process builds ``ActorPPOTrainer`` with the SAPO wrapper and
    the CPU weight sync to vLLM (inert where CUDA exists) and ``--sgrpo.optimizer`` in its DeepSpeed config."""

    def __init__(self, *args, **kwargs) -> None:
        install_sapo_patch()
        install_cpu_weight_sync()
        install_sync_verify()  # after the CPU sync: it checks whichever sync path runs
        install_optimizer_choice()
        super().__init__(*args, **kwargs)


SGRPOPPOTrainerAsync = _remote_like(ppo_trainer_async.PPOTrainerAsync, SGRPOPPOTrainerAsyncImpl)
SGRPOPolicyModelActor = _remote_like(ppo_actor.PolicyModelActor, SGRPOPolicyModelActorImpl)

# (module, name) -> our class: every name OpenRLHF's driver-side train() resolves at call time.
DRIVER_REPLACEMENTS = {
    ("openrlhf.cli.train_ppo_ray", "PolicyModelActor"): SGRPOPolicyModelActor,
    ("openrlhf.trainer.ppo_trainer", "PPOTrainer"): SGRPOPPOTrainer,
    ("openrlhf.trainer.ppo_trainer_async", "PPOTrainerAsync"): SGRPOPPOTrainerAsync,
}


# The engine factory train() calls: upstream's own, its engines remembered so that our CLI can
# end them cleanly (openrlhf_ext/vllm_engines.py); the HF engine with --sgrpo.rollout_engine hf.
ENGINE_FACTORY = ("openrlhf.cli.train_ppo_ray", "create_vllm_engines")


def install_actor_classes(hf_engines: bool = False) -> None:
    """In the driver, before ``train(args)``: make ``train()`` create our actors (idempotent), and
    its engines through :func:`~openrlhf_sgrpo.openrlhf_ext.vllm_engines.create_vllm_engines_tracked`
    (with ``hf_engines``, HF rollout engines instead: ``--sgrpo.rollout_engine hf``)."""
    import importlib

    from openrlhf_sgrpo.openrlhf_ext.hf_rollout_actor import create_hf_engines_like_vllm
    from openrlhf_sgrpo.openrlhf_ext.vllm_engines import create_vllm_engines_tracked

    for (module, name), cls in DRIVER_REPLACEMENTS.items():
        setattr(importlib.import_module(module), name, cls)
    factory = create_hf_engines_like_vllm if hf_engines else create_vllm_engines_tracked
    setattr(importlib.import_module(ENGINE_FACTORY[0]), ENGINE_FACTORY[1], factory)
