"""Install our OpenRLHF extensions in the *current* process (driver or Ray worker).

OpenRLHF builds its experience maker inside the trainer actor, a separate Ray worker process,
so patching the driver alone does nothing. This function is therefore run in every worker:
as Ray's ``worker_process_setup_hook`` (set by our CLI's ``ray.init``) and again by our
trainer actor's ``__init__``. It is idempotent and cheap.
"""

from __future__ import annotations

from collections.abc import Callable

# Dotted path Ray imports in each worker before it runs any task.
WORKER_SETUP_HOOK = "openrlhf_sgrpo.openrlhf_ext.patches.install_patches"

_EXTRA_INSTALLERS: list[Callable[[], None]] = []


def register_installer(fn: Callable[[], None]) -> Callable[[], None]:
    """Let another extension (e.g. the SAPO loss) run inside :func:`install_patches`."""
    if fn not in _EXTRA_INSTALLERS:
        _EXTRA_INSTALLERS.append(fn)
    return fn


def install_patches() -> None:
    """Point OpenRLHF's trainer module at our experience maker (and run extra installers)."""
    import openrlhf.trainer.ppo_trainer as ppo_trainer

    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    # BasePPOTrainer.__init__ (sync and async trainers alike) looks this name up at call time.
    ppo_trainer.RemoteExperienceMaker = StratifiedExperienceMaker
    for fn in _EXTRA_INSTALLERS:
        fn()


def patches_active() -> bool:
    """True when this process's trainer module builds our experience maker."""
    import openrlhf.trainer.ppo_trainer as ppo_trainer

    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    return ppo_trainer.RemoteExperienceMaker is StratifiedExperienceMaker


# SAPO's actor-loss patch (imports only torch and our math at module level: no cycle).
from openrlhf_sgrpo.openrlhf_ext.sapo_actor import install_sapo_patch  # noqa: E402

register_installer(install_sapo_patch)
