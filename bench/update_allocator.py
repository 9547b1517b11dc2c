"""Wall, system CPU time and peak RSS of the runner's policy update under several heap settings, one run.

    .venv/bin/python bench/update_allocator.py [--model smollm2] [--samples 8] [--tokens 450] [--steps 2]

Each setting runs in a fresh child process (glibc reads its tunables at start-up): ``default``
(glibc as shipped: a dynamic mmap threshold that grows to 32 MB), ``mmap-1MB`` (the demo's
``--compact-heap``, :func:`openrlhf_sgrpo.local.heap.map_large_allocations`: RSS near the live tensors, but every freed tensor of 1 MB or more is unmapped and the next one
faults fresh pages in) and ``mmap-1MB+THP`` (the same with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``,
so glibc asks for transparent huge pages on its mappings: one fault per 2 MB instead of per 4 kB
where the kernel's THP mode is ``madvise``), ``mmap-4MB`` / ``mmap-8MB`` (fixed thresholds
between the two). The workload is the demo's update: ``--samples``
sequences of ``--tokens`` tokens, micro-batches of 2, gradient checkpointing, fused AdamW,
``--steps`` optimizer steps after one warm-up step. Prints each setting's seconds per step, the
share of CPU time spent in the kernel, peak RSS, and the ratio of step time to ``mmap-1MB``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# name -> (extra environment, mmap threshold in bytes or None for glibc's dynamic one)
SETTINGS = {"default": ({}, None), "mmap-1MB": ({}, 1 << 20),
            "mmap-1MB+THP": ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, 1 << 20),
            "mmap-4MB": ({}, 4 << 20), "mmap-8MB": ({}, 8 << 20)}


def child(args: argparse.Namespace) -> dict:
    """One setting: the update steps, measured inside this process."""
    import torch

    from openrlhf_sgrpo.local.heap import map_large_allocations
    from openrlhf_sgrpo.local.models import load_policy

    if args.map_large:
        map_large_allocations(args.map_large)
    torch.manual_seed(0)
    model, _ = load_policy(args.model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    vocab = model.config.vocab_size
    batches = [torch.randint(0, vocab, (2, args.tokens)) for _ in range(args.samples // 2)]

    def step() -> None:
        for ids in batches:
            logits = model(input_ids=ids).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), ids[:, 1:].reshape(-1))
            (loss / len(batches)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up: optimizer state, allocator pools
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    for _ in range(args.steps):
        step()
    wall, r1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_SELF)
    user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    return {"s_per_step": wall / args.steps, "sys_share": system / max(user + system, 1e-9),
            "peak_rss_mib": r1.ru_maxrss / 1024}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--tokens", type=int, default=450)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--map-large", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    args = p.parse_args()
    for name in ("samples", "tokens", "steps"):
        if getattr(args, name) < (2 if name == "samples" else 1):
            p.error(f"--{name} is too small: {getattr(args, name)}")
    if args.child:
        print(json.dumps(child(args)))
        return 0

    from openrlhf_sgrpo.eval.table import format_table

    results = {}
    for name in dict.fromkeys(["mmap-1MB", *args.settings]):  # the baseline always runs
        env, threshold = SETTINGS[name]
        cmd = [sys.executable, __file__, "--child", name, "--model", args.model, "--samples", str(args.samples),
               "--tokens", str(args.tokens), "--steps", str(args.steps), "--map-large", str(threshold or 0)]
        out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, check=True)
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{args.model}: {args.samples} samples x {args.tokens} tokens per update, micro-batch 2, "
          f"gradient checkpointing, fused AdamW; {args.steps} timed steps per setting")
    base = results["mmap-1MB"]["s_per_step"]
    table = [[name, f"{r['s_per_step']:.1f}", f"{r['sys_share']:.2f}", f"{r['peak_rss_mib']:.0f}",
              f"{r['s_per_step'] / base:.2f}"] for name, r in results.items()]
    print(format_table(["heap setting", "s / step", "kernel CPU share", "peak RSS MiB", "x mmap-1MB"], table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
