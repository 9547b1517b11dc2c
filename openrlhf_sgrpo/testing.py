"""What tests/ and bench/ share (never imported by the runtime): GPU-import stand-ins and seeds.

GPU-only imports: OpenRLHF's trainer modules import ``vllm`` and ``flash_attn`` at module
import time. On a CPU machine the tests and the advantage bench put *import-only* stand-ins for
those modules in ``sys.modules`` (as OpenRLHF's own tests do) and then run the real OpenRLHF
code paths.

Seeds: sampled model output depends on the CPU's floating point, so no test may need a lucky
seed. ``SGRPO_TEST_SEED_SHIFT=k`` adds ``k`` to every seed the tests pass through
:func:`shifted_seed`, as a stand-in for another machine: a test that holds by construction passes
under every shift.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

SEED_SHIFT_ENV = "SGRPO_TEST_SEED_SHIFT"

VLLM_SAMPLING_DEFAULTS = {"n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 16, "min_tokens": 0,
                          "stop": None, "stop_token_ids": None, "include_stop_str_in_output": False,
                          "skip_special_tokens": True, "logprobs": None, "ignore_eos": False, "seed": None}
GPU_ONLY_MODULES = {
    # SamplingParams: OpenRLHF's SamplesGenerator builds one with keyword arguments; the agent and
    # the engine read fields by name, with vLLM's defaults for those it does not set.
    "vllm": {"SamplingParams": type("SamplingParams", (types.SimpleNamespace,), dict(VLLM_SAMPLING_DEFAULTS)),
             "__version__": "0.29.0"},
    "vllm.inputs": {"TokensPrompt": dict},
    "vllm.utils": {"random_uuid": lambda: "0"},
    "flash_attn": {"__version__": "2.8.3"},
    "flash_attn.bert_padding": {n: None for n in ("index_first_axis", "pad_input", "rearrange", "unpad_input")},
    "flash_attn.utils": {},
    "flash_attn.utils.distributed": {"all_gather": None},
}


def install_gpu_import_stubs() -> None:
    """Put import-only stand-ins for vllm/flash_attn in sys.modules (idempotent)."""
    for name, attrs in GPU_ONLY_MODULES.items():
        if name in sys.modules:
            continue
        mod = types.ModuleType(name)
        # A spec without a loader: find_spec() answers, but transformers' metadata lookup
        # still reports flash-attn as not installed, so no kernel path is taken.
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod


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
