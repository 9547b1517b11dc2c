"""Training weights into a running vLLM engine without CUDA: one safetensors file in shared memory.

OpenRLHF syncs weights to vLLM over CUDA IPC (colocated runs) or an NCCL group; neither exists
on a CPU, and a plain ``model.load_weights`` of Linear weights fails on vLLM's CPU build (it
repacks them for its kernels). What works there is vLLM's own in-place reload:
``Worker.reload_weights(weights_iterator=..., is_checkpoint_format=True)`` takes checkpoint-format
tensors and runs the same post-load processing as the first load. So the trainer writes its
parameters under their Hugging Face names to one file in ``/dev/shm`` (RAM, no disk), every vLLM
worker reloads from it (a ``collective_rpc`` callable, :func:`reload_worker_weights`), and the file
is removed. 0.1-0.3 s for SmolLM2-135M on 2 cores.

The same two functions serve the single-machine runner (an in-process ``AsyncLLM``) and the
cluster path without CUDA (OpenRLHF's ``RolloutRayActor``; see
:mod:`openrlhf_sgrpo.openrlhf_ext.cpu_weight_sync`). On a GPU OpenRLHF's own paths stay in charge.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch

from openrlhf_sgrpo.engine.weight_check import engine_parameters

SHM = Path("/dev/shm")
FILE_PREFIX = "sgrpo-weights-"


def _shared_memory_dir() -> Path:
    """``/dev/shm`` where it is a writable folder (Linux), else the temp folder."""
    return SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else Path(tempfile.gettempdir())


def write_weights(named_tensors: Iterable[tuple[str, torch.Tensor]], directory: Path | None = None) -> Path:
    """The tensors as one safetensors file (a fresh name, so concurrent syncs never collide).

    The same tensor seen twice (a tied embedding) is written once under the first name; vLLM's
    loaders skip the tied copy anyway. "The same" is the same memory: address, shape, strides and
    dtype, on any device. Not ``id()`` of the detached view: the view is freed each iteration and
    Python reuses its id, which on CUDA (2026-11-27, H100, vLLM 0.26.0) dropped a random 10-20 %
    of the tensors from every sync (vLLM then kept those layers' old weights: "Following weights
    were not loaded from checkpoint"). Not the storage alone either: parameters that are views of
    one flat buffer share a storage. Every tensor seen is held until the file is written, so no
    address is freed and reused within one sync (a generator may yield temporaries)."""
    from safetensors.torch import save_file

    seen: set[tuple] = set()
    held: list[torch.Tensor] = []
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in named_tensors:
        held.append(tensor)
        data = tensor.detach()
        key = (data.device, data.data_ptr(), tuple(data.shape), data.stride(), data.dtype)
        if key in seen:
            continue
        seen.add(key)
        tensors[name] = data.to("cpu").contiguous()
    path = (directory or _shared_memory_dir()) / f"{FILE_PREFIX}{os.getpid()}-{uuid.uuid4().hex}.safetensors"
    try:
        save_file(tensors, str(path))
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def check_delivered(counts: list[int], model) -> int:
    """The fewest tensors a worker read, checked against what ``model`` has (tied ones once).

    vLLM only logs the weights a reload did not get and keeps their old values, so a short file
    would train against a partly stale engine unnoticed (the GPU bug of 2026-11-27 above)."""
    expected = sum(1 for _ in model.named_parameters())
    got = min(counts) if counts else 0
    if got != expected:
        raise RuntimeError(f"weight sync delivered {got} of the model's {expected} tensors to a vLLM worker; "
                           "the engine keeps stale weights for the rest")
    return got


def sync_via_file(model, reload: Callable[[str], list[int]]) -> int:
    """One sync, whoever the engines are: ``model``'s parameters into one file, ``reload(path)``
    has every worker load it and returns how many tensors each read, the file goes, and a short
    read raises (:func:`check_delivered`). The single-machine engine and the CPU cluster path both
    sync through here, so neither can skip the check. Returns the tensors delivered per worker."""
    path = write_weights(model.named_parameters())
    try:
        counts = reload(str(path))
    finally:
        path.unlink(missing_ok=True)
    return check_delivered(counts, model)


def _iter_file(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            yield name, f.get_tensor(name)


def reload_worker_weights(worker, path: str) -> int:
    """Inside a vLLM worker (``collective_rpc`` passes the worker first): reload every tensor of
    ``path`` in place, in checkpoint format. Returns how many tensors the file held."""
    count = 0

    def counted():
        nonlocal count
        for item in _iter_file(path):
            count += 1
            yield item

    worker.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)
    repack_tied_head(worker.get_model())
    return count


def _tied_head(model) -> torch.nn.Module | None:
    """The model's LM head where it shares its weight with the input embedding, else None."""
    head = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.numel() == 0:
        return None
    for name, module in model.named_modules():
        if module is head or not name.endswith("embed_tokens"):
            continue
        other = getattr(module, "weight", None)
        if isinstance(other, torch.Tensor) and other.data_ptr() == weight.data_ptr():
            return head
    return None


def repack_tied_head(model) -> bool:
    """Re-pack a tied LM head's GEMM from the reloaded embedding; True if there was one to re-pack.

    vLLM's CPU build computes every Linear, the LM head included, through a handle packed from its
    weight when the weights are processed (``dispatch_cpu_unquantized_gemm``: a oneDNN or AMX
    layout, a copy). A reload in checkpoint format finds no tensor of its own for a tied head
    (it logs "ParallelLMHead: Failed to load weights") and does not process it again: the
    embedding moves, the head's packed copy keeps the weights of the first load. Measured on the
    fitted tiny Qwen2 after a known change (embedding x3): the engine's log-probs matched a model
    with the *old* head to 1e-6 and the trainer's to 16 nats/token. On a GPU there is no packed
    copy (the head reads the shared parameter), so nothing is done there."""
    head = _tied_head(model)
    if head is None or not hasattr(head, "cpu_linear"):
        return False
    head.quant_method.process_weights_after_loading(head)
    return True


def leftover_files(directory: Path | None = None) -> list[Path]:
    """Weight files of this module still present (a test checks a sync leaves none)."""
    return sorted((directory or _shared_memory_dir()).glob(f"{FILE_PREFIX}*"))


def read_worker_weights(worker) -> dict[str, torch.Tensor]:
    """Inside a vLLM worker (``collective_rpc``): a copy of every tensor the model still holds in
    readable form, under vLLM's names (fused ``qkv_proj`` / ``gate_up_proj``), for checking what a
    sync delivered. vLLM's CPU build repacks Linear weights for its GEMM kernels and leaves their
    parameters empty, so those are absent here; the LM head is read as ``lm_head.weight`` even where
    it is tied to the embedding (it is a module of its own, which ``named_parameters`` dedupes)."""
    return {name: p.detach().to("cpu").clone() for name, p in engine_parameters(worker.get_model()) if p.numel() > 0}
