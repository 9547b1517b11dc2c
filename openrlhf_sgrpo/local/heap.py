"""glibc heap settings that keep a CPU training process's RSS near what its tensors hold.

Measured on SmolLM2-135M (fused AdamW, gradient checkpointing, 2 x 600-token micro-batches):
with glibc's defaults the second optimizer step peaked at 3.77 GB RSS and sat at 3.32 GB after
it, while the live tensors (weights, AdamW moments, gradients) were ~2.2 GB. Two causes:

* glibc raises its mmap threshold after every freed mmapped block (up to 32 MB), so the
  activations and per-layer gradients of later steps come from the brk heap, where freed
  holes fragment and are never returned. A fixed 1 MB threshold keeps every tensor of 1 MB or
  more in its own mapping, returned to the OS when freed (peak 3.03 GB, 2.27 GB after the step);
* the engine generates on worker threads, whose arenas keep what they freed; see
  :func:`release_freed_memory`.
Both are no-ops where the C library is not glibc.

The price of the first, measured by ``bench/update_allocator.py`` (SmolLM2-135M, 8 x 450 tokens,
micro-batches of 2, 2 cores, same run): every freed activation of 1 MB or more is unmapped and
the next one faults fresh pages in, so the kernel's share of CPU time rose from 0.05 to 0.20 and
an update took 34.8 s instead of 28.7 s (threshold 4 MB: 4.1 GB peak, as with glibc's default;
1 MB: 3.4 GB). Since the demo's generation moved to vLLM, whose engine processes hold ~3 GB of
their own, the demo keeps glibc's default and offers the 1 MB threshold as ``--compact-heap``.
"""

from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
LARGE_ALLOCATION_BYTES = 1 << 20


def _libc():
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def map_large_allocations(threshold: int = LARGE_ALLOCATION_BYTES) -> bool:
    """Serve allocations of ``threshold`` bytes or more with their own mmap (glibc ``mallopt``);
    call once at process start. Returns whether the setting took."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))


def release_freed_memory() -> None:
    """Hand freed heap memory back to the OS (glibc's ``malloc_trim``).

    The engine runs its batches on worker threads, whose malloc arenas keep freed KV caches and
    activations (~0.6 GB after a SmolLM2 rollout) where the training thread cannot reuse them,
    and the other way round for what an update freed. A rollout trims on entry and on exit, so
    neither side's leftovers add to the other's peak."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
