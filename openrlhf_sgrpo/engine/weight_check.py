"""Exact per-tensor digests and the Hugging Face -> vLLM name map: checking a weight sync by value
without moving the weights again.

Why digests: a sync's correctness is a property of bytes (every tensor the engine holds is the
trainer's, rounded as vLLM rounds it on load), and copying the engine's tensors back to compare
them would move a second model over Ray at each sync (16 GB for an 8B model in bf16). So each side
reduces each tensor, on the device where it lives, to one integer, and only the integers travel.

The digest must agree bit for bit between a GPU trainer, a GPU engine and a CPU engine holding
the same bytes, so it is integer arithmetic only: the tensor's bytes read as int16 (int8 for
1-byte dtypes), each value times a weight ``r**i mod P`` of its global position ``i`` (a polynomial
hash, ``P = 2**31 - 1``), summed in int64 in rows of ``DIGEST_ROW`` products (each below
``2**46`` in magnitude, so a row's sum cannot overflow) and reduced ``mod P``: integer sums are
exact in any reduction order, and the result depends on neither the chunking nor the device. Two lanes with two primitive roots ``r`` of ``P`` give a 62-bit digest. With ``r`` a
primitive root, one changed value, or two different values swapped, always changes a lane
(``dv * r**i != 0`` and ``r**i != r**j mod P`` for ``i != j`` below ``P - 1`` positions, 4 GiB
of int16); other corruptions collide with probability about ``2**-62``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

DIGEST_MODULUS = 2**31 - 1  # a Mersenne prime
DIGEST_ROOTS = (16807, 48271)  # primitive roots mod 2**31 - 1 (the two MINSTD multipliers)
# Values per reduction: each term < 2**31, so a chunk's int64 sum stays below 2**53. The int64
# temporaries of one chunk (32 MiB each) are what the check adds to a GPU already holding a model.
DIGEST_CHUNK = 1 << 22
# Products summed in int64 before a reduction mod P: each below 2**46 in magnitude, 2**17 of them
# below 2**63.
DIGEST_ROW = 1 << 17

# vLLM fuses these Hugging Face projections into one parameter, their rows concatenated in this order.
FUSED_PROJECTIONS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
# Engine tensors whose extra rows are vLLM's vocabulary padding (zeros beyond the trainer's vocabulary).
VOCAB_PADDED = ("embed_tokens.weight", "lm_head.weight")

_POWERS: dict[tuple[torch.device, int], torch.Tensor] = {}


def _powers(device: torch.device, root: int, n: int) -> torch.Tensor:
    """``root**j mod P`` for ``j < n`` (int64, on ``device``), built by doubling; the longest table
    built per device and root is kept (at most ``chunk`` entries: 32 MiB at the default)."""
    table = _POWERS.get((device, root))
    if table is None or table.numel() < n:
        table = torch.ones(1, dtype=torch.int64, device=device)
        while table.numel() < n:
            step = pow(root, table.numel(), DIGEST_MODULUS)
            table = torch.cat([table, table * step % DIGEST_MODULUS])
        _POWERS[(device, root)] = table
    return table[:n]


def _as_int_units(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, flat, as int16 (int8 for 1-byte dtypes): the same bytes give the same
    values on every device (every processor we run on is little-endian)."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    return flat.view(torch.int16 if flat.element_size() % 2 == 0 else torch.int8)


def _chunk_lane(values: torch.Tensor, powers: torch.Tensor) -> int:
    """``sum(values * powers) mod P`` exactly: each product is below ``2**46`` in magnitude, so a
    sum over ``DIGEST_ROW`` of them stays inside int64; rows are reduced ``mod P`` before the
    final sum."""
    products = values * powers
    full = products.numel() - products.numel() % DIGEST_ROW
    total = int(torch.remainder(products[:full].view(-1, DIGEST_ROW).sum(1), DIGEST_MODULUS).sum())
    if full < products.numel():
        total += int(products[full:].sum())
    return total % DIGEST_MODULUS


def digest_parts(parts: Iterable[torch.Tensor], chunk: int = DIGEST_CHUNK) -> int:
    """One digest of the tensors' bytes laid end to end (rows of fused parameters: the digest of
    ``torch.cat(parts)`` without building it), computed where each tensor lives. A chunk starting
    at position ``s`` contributes ``r**s * sum_j v_j r**j``: the power table is the same for every
    chunk, the shift is one modular product in Python."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    lanes = [0] * len(DIGEST_ROOTS)
    position = 0
    for part in parts:
        units = _as_int_units(part)
        size = min(chunk, units.numel()) or 1
        for start in range(0, units.numel(), size):
            values = units[start:start + size].to(torch.int64)
            for k, root in enumerate(DIGEST_ROOTS):
                local = _chunk_lane(values, _powers(values.device, root, values.numel()))
                shift = pow(root, position + start, DIGEST_MODULUS)
                lanes[k] = (lanes[k] + local * shift) % DIGEST_MODULUS
        position += units.numel()
    return sum(lane << (32 * k) for k, lane in enumerate(lanes))


def tensor_digest(tensor: torch.Tensor, chunk: int = DIGEST_CHUNK) -> int:
    """:func:`digest_parts` of one tensor."""
    return digest_parts([tensor], chunk)


def engine_sources(hf_names: Sequence[str]) -> dict[str, list[str]]:
    """vLLM's parameter name -> the Hugging Face parameters it holds, rows in order: q/k/v as
    ``qkv_proj`` and gate/up as ``gate_up_proj``, every other name as itself, and ``lm_head.weight``
    as the embedding where the model ties them (HF's ``named_parameters`` then lists only the
    embedding). Order: the first part's position in ``hf_names`` (the same on every rank)."""
    names = set(hf_names)
    out: dict[str, list[str]] = {}
    for name in hf_names:
        fused = next(((f, ps) for f, ps in FUSED_PROJECTIONS.items() if any(f".{p}." in name for p in ps)), None)
        if fused is None:
            out[name] = [name]
            continue
        target, parts = fused
        first = next(p for p in parts if f".{p}." in name)
        vllm_name = name.replace(f".{first}.", f".{target}.")
        if vllm_name not in out:
            out[vllm_name] = [vllm_name.replace(f".{target}.", f".{p}.") for p in parts]
            missing = [n for n in out[vllm_name] if n not in names]
            if missing:
                raise ValueError(f"{vllm_name}: the trainer has {name} but not {missing}")
    if "lm_head.weight" not in names and "model.embed_tokens.weight" in names:
        out["lm_head.weight"] = ["model.embed_tokens.weight"]
    return out


def as_engine_holds(tensor: torch.Tensor, engine_dtype: torch.dtype) -> torch.Tensor:
    """The trainer's tensor as a sync leaves it in an engine parameter of ``engine_dtype``: vLLM's
    loader copies what it is sent into the parameter, one cast from the sent dtype.

    Not "rounded to the model dtype, then held in the parameter's": the two differ where a
    parameter is kept in another dtype than the model's, and a sync then does not round through
    the model dtype. vLLM's CPU build on a Xeon with AMX holds the biases of its SGL-kernel Linears
    in fp32 in a bf16 model: the first load rounds them to bf16, a reload copies the trainer's fp32
    values as they are (measured with that kernel path forced on an AVX-512 BF16 EPYC,
    ``tests/test_engines.py``)."""
    return tensor.detach().to(engine_dtype)


def vocab_padding(name: str, engine_shape: Sequence[int], rows: int) -> int:
    """Rows of zeros vLLM appended to an embedding or LM head (its vocabulary is padded to a
    multiple of 64) beyond the trainer's ``rows``; 0 for every other tensor."""
    if name.endswith(VOCAB_PADDED) and engine_shape and engine_shape[0] > rows:
        return engine_shape[0] - rows
    return 0


def dtype_of(name: str) -> torch.dtype:
    """``"torch.bfloat16"`` -> ``torch.bfloat16`` (digest reports carry dtypes as strings)."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def engine_parameters(model) -> list[tuple[str, torch.Tensor]]:
    """A vLLM model's parameters under its own names, the LM head included as ``lm_head.weight``
    where it is tied to the embedding (``named_parameters`` lists a shared parameter once, under
    the embedding's name, but vLLM's CPU build computes the head from a packed copy of its own)."""
    named = list(model.named_parameters())
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    if isinstance(head, torch.Tensor) and "lm_head.weight" not in dict(named):
        named.append(("lm_head.weight", head))
    return named


def worker_weight_digests(worker) -> dict:
    """Inside a vLLM worker (``collective_rpc`` passes the worker first): every parameter's
    ``(shape, dtype, digest)`` under vLLM's names, computed on the worker's device. vLLM's CPU
    build repacks Linear weights for its kernels and leaves their parameters empty: those are
    listed as unreadable. The LM head is read as
    ``lm_head.weight`` even where it is tied to the embedding (``named_parameters`` lists a shared
    parameter once, under the embedding's name)."""
    tensors, unreadable = {}, []
    with torch.no_grad():
        for name, param in engine_parameters(worker.get_model()):
            if param.numel() == 0:
                unreadable.append(name)
                continue
            tensors[name] = (tuple(param.shape), str(param.dtype), tensor_digest(param))
    return {"tensors": tensors, "unreadable": sorted(unreadable)}


def differing(engine: dict[str, tuple], trainer: dict[str, tuple]) -> list[str]:
    """Each engine tensor whose ``(shape, dtype, digest)`` is not the trainer's (``trainer``: the
    same triple computed from the trainer's tensor in the engine's form), with why, sorted."""
    bad = []
    for name, (shape, dtype, digest) in sorted(engine.items()):
        want = trainer.get(name)
        if want is None:
            bad.append(f"{name} (no trainer tensor maps to it)")
        elif tuple(want[0]) != tuple(shape):
            bad.append(f"{name} (shape {tuple(shape)}, trainer {tuple(want[0])})")
        elif want[2] != digest:
            bad.append(f"{name} (values differ)")
    return bad
