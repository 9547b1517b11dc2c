"""``--sgrpo.optimizer torch_fused``: the policy's AdamW with no CUDA extension to build.

OpenRLHF 0.11.2 asks DeepSpeed for ``{"type": "AdamW", "params": {lr, betas, eps, weight_decay}}``
(``DeepspeedStrategy._ds_init_train_model``), and DeepSpeed 0.19.6 answers with its FusedAdam
(or DeepSpeedCPUAdam under ``--ds.adam_offload``), which its op builder JIT-compiles with nvcc in
the policy actor the first time: a minute or more on a fresh machine, a failure where the
toolchain does not fit (the lent H200 died there on 2026-11-26, docs/deploy.md). DeepSpeed's own
``torch_adam`` optimizer param makes it build ``torch.optim.AdamW`` instead
(``DeepSpeedEngine.get_optimizer_configuration``), and ``fused: True`` picks torch's fused kernel,
which ships compiled in torch's CUDA wheel. The update is the same AdamW: bias-corrected moments,
``eps`` added after the square root, weight decay decoupled (``p -= lr * wd * p``) exactly as
FusedAdam's ``adam_w_mode``; DeepSpeed's ZeRO optimizer wraps it like FusedAdam
(``torch.optim.AdamW`` is in ``ZERO_SUPPORTED_OPTIMIZERS``), and fused keeps the ``step`` count on
the parameters' device, so ``--ds.enable_sleep``'s offload and reload of the optimizer state moves
it back where the kernel expects it.

The default (``deepspeed``) keeps upstream's choice; our ``PolicyModelActor`` installs the wrapper
in its own process (:func:`install_optimizer_choice`). A critic (GAE) keeps DeepSpeed's choice.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

OPTIMIZERS = ("deepspeed", "torch_fused")
DEFAULT_OPTIMIZER = "deepspeed"
# What DeepSpeed 0.19.6 reads from the optimizer params (engine.get_optimizer_configuration).
TORCH_FUSED_PARAMS = {"torch_adam": True, "fused": True}
_PATCH_MARK = "_sgrpo_optimizer_choice"


def optimizer_choice(args: Any) -> str:
    """``--sgrpo.optimizer`` of the run's args (the default where the flag is absent)."""
    return getattr(getattr(args, "sgrpo", None), "optimizer", DEFAULT_OPTIMIZER) or DEFAULT_OPTIMIZER


def with_optimizer_choice(ds_config: dict, choice: str) -> dict:
    """``ds_config`` with its AdamW section set up for ``choice`` (a copy; Muon or no optimizer
    section, or ``deepspeed``, leave it as it is)."""
    if choice not in OPTIMIZERS:
        raise ValueError(f"--sgrpo.optimizer must be one of {', '.join(OPTIMIZERS)}, got {choice!r}")
    optimizer = ds_config.get("optimizer")
    if choice == DEFAULT_OPTIMIZER or not optimizer or str(optimizer.get("type", "")).lower() != "adamw":
        return ds_config
    config = copy.deepcopy(ds_config)
    config["optimizer"]["params"] = {**config["optimizer"].get("params", {}), **TORCH_FUSED_PARAMS}
    return config


def install_optimizer_choice() -> None:
    """Wrap ``DeepspeedStrategy.get_ds_train_config`` once per process so that the training config
    carries ``--sgrpo.optimizer`` (read from the strategy's own args)."""
    from openrlhf.utils.deepspeed.deepspeed import DeepspeedStrategy

    original = DeepspeedStrategy.get_ds_train_config
    if getattr(original, _PATCH_MARK, False):
        return

    @functools.wraps(original)
    def get_ds_train_config(self, optim_dict: dict | None = None, **kwargs: Any) -> dict:
        return with_optimizer_choice(original(self, optim_dict, **kwargs), optimizer_choice(self.args))

    setattr(get_ds_train_config, _PATCH_MARK, True)
    DeepspeedStrategy.get_ds_train_config = get_ds_train_config
