"""Import-only stand-ins for the GPU-only modules OpenRLHF's trainer imports at module level.

OpenRLHF 0.11.2 imports ``vllm`` (``SamplingParams``, ``TokensPrompt``, ``random_uuid``) and
``flash_attn`` (ring attention helpers) when its trainer modules load, whether or not a run uses
them. Two users need the imports to succeed without the packages: the tests and benches on CPU
machines (as OpenRLHF's own tests do), and ``--sgrpo.rollout_engine hf``, which trains with the
project's HF engine where vLLM is not installed. Only names are provided: a run that really calls
vLLM or flash-attn code fails there, loudly. transformers still reports flash-attn as missing (the
spec has no loader), so it never takes a flash-attn kernel path.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

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


def _installed(top: str) -> bool:
    if top in sys.modules:
        return getattr(sys.modules[top].__spec__, "loader", None) is not None
    return importlib.util.find_spec(top) is not None


def install(only_missing: bool = False, packages: tuple[str, ...] = ("vllm", "flash_attn")) -> None:
    """Put the stand-ins for ``packages`` in ``sys.modules`` (idempotent). ``only_missing``: leave a
    package that is really installed alone (``--sgrpo.rollout_engine hf`` on a machine that has vLLM)."""
    for name, attrs in GPU_ONLY_MODULES.items():
        if name.split(".")[0] not in packages:
            continue
        if name in sys.modules or (only_missing and _installed(name.split(".")[0])):
            continue
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod


def install_missing() -> None:
    """Ray's ``worker_process_setup_hook`` for ``--sgrpo.rollout_engine hf``: it runs before Ray
    assigns the worker its GPUs, so it must not touch CUDA (``tests/test_cluster_ray.py`` checks)."""
    install(only_missing=True)


def install_missing_flash_attn() -> None:
    """Ray's ``worker_process_setup_hook`` on the vLLM path: OpenRLHF's trainer modules import
    flash-attn's ring-attention helpers at module level, and flash-attn 2.8.3 ships no wheel for
    every CUDA torch (none for torch 2.11 + CUDA 13, the lent GPU machines'). vLLM itself is never
    stood in for here: the rollout needs the real engine. Touches no CUDA."""
    install(only_missing=True, packages=("flash_attn",))
