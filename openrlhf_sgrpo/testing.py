"""What tests/ and bench/ share (never imported by the runtime): GPU-import stand-ins and seeds.

GPU-only imports: OpenRLHF's trainer modules import ``vllm`` and ``flash_attn`` at module
import time. On a CPU machine the tests and the advantage bench put *import-only* stand-ins for
those modules in ``sys.modules`` (as OpenRLHF's own tests do; defined in
:mod:`openrlhf_sgrpo.openrlhf_ext.gpu_import_standins`) and then run the real OpenRLHF code paths.

Seeds: sampled model output depends on the CPU's floating point, so no test may need a lucky
seed. ``SGRPO_TEST_SEED_SHIFT=k`` adds ``k`` to every seed the tests pass through
:func:`shifted_seed`, as a stand-in for another machine: a test that holds by construction passes
under every shift.
"""

from __future__ import annotations

import os

from openrlhf_sgrpo.openrlhf_ext.gpu_import_standins import GPU_ONLY_MODULES, VLLM_SAMPLING_DEFAULTS, install

__all__ = ["GPU_ONLY_MODULES", "VLLM_SAMPLING_DEFAULTS", "install_gpu_import_stubs", "seed_shift", "shifted_seed"]

SEED_SHIFT_ENV = "SGRPO_TEST_SEED_SHIFT"


def install_gpu_import_stubs() -> None:
    """Put import-only stand-ins for vllm/flash_attn in sys.modules (idempotent)."""
    install(only_missing=True)


def seed_shift() -> int:
    """``$SGRPO_TEST_SEED_SHIFT`` as an int (0 when unset); a bad value is named."""
    raw = os.environ.get(SEED_SHIFT_ENV, "0").strip() or "0"
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{SEED_SHIFT_ENV} must be an integer, got {raw!r}") from None


def shifted_seed(base: int) -> int:
    """The seed a test uses for ``base``: shifted by ``$SGRPO_TEST_SEED_SHIFT``."""
    return base + seed_shift()
