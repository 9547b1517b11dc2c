"""The CLI puts OpenRLHF's single controller (``PPOTrainer`` / ``PPOTrainerAsync``) on the
driver's node (docs/multinode.md, "What runs where"): ``train()`` creates it with ``.remote(...)``
through the module attribute, which :func:`pin_trainer_to_driver_node` replaces for the run and
:func:`unpin_trainer` restores. The two-node Docker test (tests/test_multinode_docker.py) checks
the placement itself: the rollout records and TensorBoard files land on the driver's node."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from openrlhf_sgrpo.cli import train_ppo_ray as cli


class FakeActorClass:
    calls: list = []

    @classmethod
    def options(cls, **options):
        return SimpleNamespace(remote=lambda *a, **k: cls.calls.append((options, a, k)) or "handle")

    marker = "class attribute"


def test_pinned_class_creates_the_actor_with_the_strategy_and_keeps_the_rest():
    FakeActorClass.calls = []
    pinned = cli.PinnedActorClass(FakeActorClass, "STRATEGY")
    assert pinned.remote(1, key=2) == "handle"
    assert FakeActorClass.calls == [({"scheduling_strategy": "STRATEGY"}, (1,), {"key": 2})]
    assert pinned.marker == "class attribute"


@pytest.mark.usefixtures("openrlhf_gpu_stubs")  # OpenRLHF's trainer modules import flash_attn names
def test_pin_is_a_soft_affinity_to_this_node_and_unpin_restores(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: "ab" * 28))
    before = {key: getattr(importlib.import_module(key[0]), key[1]) for key in cli.TRAINER_CLASSES}
    replaced = cli.pin_trainer_to_driver_node()
    try:
        assert replaced == before
        for module, name in cli.TRAINER_CLASSES:
            pinned = getattr(importlib.import_module(module), name)
            assert isinstance(pinned, cli.PinnedActorClass) and pinned.cls is before[(module, name)]
            assert pinned.scheduling_strategy.node_id == "ab" * 28 and pinned.scheduling_strategy.soft is True
    finally:
        cli.unpin_trainer(replaced)
    assert {key: getattr(importlib.import_module(key[0]), key[1]) for key in cli.TRAINER_CLASSES} == before
