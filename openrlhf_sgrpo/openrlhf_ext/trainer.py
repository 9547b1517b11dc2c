"""Our trainer actor: OpenRLHF's PPOTrainer that installs the patches in its own process.

Ray pickles this class by reference, so a worker that deserializes it imports this module,
and ``__init__`` runs :func:`install_patches` before OpenRLHF builds the experience maker.
Together with the worker setup hook this covers both the sync and the async trainer.
"""

from __future__ import annotations

import ray
from openrlhf.trainer import ppo_trainer as _upstream

from openrlhf_sgrpo.openrlhf_ext.patches import install_patches

_UpstreamPPOTrainer = _upstream.PPOTrainer.__ray_actor_class__  # the plain class under @ray.remote


class SGRPOPPOTrainerImpl(_UpstreamPPOTrainer):
    """Plain (non-actor) class, kept importable for tests and subclassing."""

    def __init__(self, *args, **kwargs) -> None:
        install_patches()
        super().__init__(*args, **kwargs)


SGRPOPPOTrainer = ray.remote(SGRPOPPOTrainerImpl)


def use_sgrpo_trainer() -> None:
    """Make ``from openrlhf.trainer.ppo_trainer import PPOTrainer`` return our actor class."""
    install_patches()
    _upstream.PPOTrainer = SGRPOPPOTrainer
