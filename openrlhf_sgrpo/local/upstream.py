"""OpenRLHF's own loss and log-prob code, loaded without ``openrlhf.models.__init__``.

``import openrlhf.models`` runs its package ``__init__``, which imports the actor and, through
``ring_attn_utils``, ``flash_attn`` (a GPU-only build). The single-machine runner must run the
*same* ``PolicyLoss``, ``compute_reward``, ``compute_approx_kl`` and ``log_probs_from_logits``
as the cluster run, without stubbing any GPU module. So we execute the two upstream files
``openrlhf/models/utils.py`` and ``openrlhf/models/loss.py`` by file location under a private
package name (the technique OpenRLHF's own tests use, e.g. ``tests/test_loss_aggregation.py``).
``utils.py`` imports the real ``deepspeed`` (installed, CPU accelerator); nothing is faked.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from pathlib import Path

PRIVATE_PACKAGE = "_sgrpo_openrlhf_models"
UPSTREAM_MODULES = ("utils", "loss")  # load order: loss.py does `from .utils import masked_mean`


def openrlhf_models_dir() -> Path:
    """``openrlhf/models`` of the installed wheel, located without importing the package."""
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("openrlhf is not installed: pip install --no-deps openrlhf==0.11.2")
    return Path(list(spec.submodule_search_locations)[0]) / "models"


@functools.lru_cache(maxsize=1)
def load_models() -> types.SimpleNamespace:
    """Execute upstream ``models/utils.py`` and ``models/loss.py`` once; return both modules."""
    models_dir = openrlhf_models_dir()
    if PRIVATE_PACKAGE not in sys.modules:
        pkg = types.ModuleType(PRIVATE_PACKAGE)
        pkg.__path__ = [str(models_dir)]
        sys.modules[PRIVATE_PACKAGE] = pkg
    loaded = {}
    for name in UPSTREAM_MODULES:
        full = f"{PRIVATE_PACKAGE}.{name}"
        if full not in sys.modules:
            spec = importlib.util.spec_from_file_location(full, models_dir / f"{name}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[full] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[full]
                raise
        loaded[name] = sys.modules[full]
    return types.SimpleNamespace(**loaded)


def policy_loss_cls():
    """OpenRLHF's ``PolicyLoss`` class (from ``openrlhf/models/loss.py``)."""
    return load_models().loss.PolicyLoss


def aggregate_loss(*args, **kwargs):
    return load_models().loss.aggregate_loss(*args, **kwargs)


def log_probs_from_logits(*args, **kwargs):
    return load_models().utils.log_probs_from_logits(*args, **kwargs)


def compute_reward(*args, **kwargs):
    return load_models().utils.compute_reward(*args, **kwargs)


def compute_approx_kl(*args, **kwargs):
    return load_models().utils.compute_approx_kl(*args, **kwargs)
