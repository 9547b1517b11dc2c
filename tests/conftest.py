"""Shared test fixtures.

GPU-only imports: OpenRLHF's trainer modules import ``vllm`` and ``flash_attn`` at module
import time. On this CPU machine tests stub *only those imports* in ``sys.modules`` (as
OpenRLHF's own tests do) and then run the real OpenRLHF code paths.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

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


@pytest.fixture(scope="session")
def openrlhf_gpu_stubs() -> None:
    install_gpu_import_stubs()
