"""What ``--sgrpo.verify_weight_sync`` adds to a weight sync, against the sync itself, one run.

    .venv/bin/python bench/sync_check.py [--model smollm2] [--repeats 3]

The check's work on each side is one digest per tensor the engine holds
(:func:`openrlhf_sgrpo.openrlhf_ext.sync_verify.trainer_digests`; the engine's side digests the
same bytes). Measured here on this machine's CPU for the trainer side, in the engine's form (bf16,
every tensor readable as on a GPU, the tied LM head digested as its own tensor as vLLM lists it),
against the baseline measured in the same run: the CPU sync's own work on the same model, writing
its safetensors file to shared memory (:func:`openrlhf_sgrpo.engine.weight_sync.write_weights`;
the engines' reload comes on top). Prints seconds (best of ``--repeats``) and the ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="a policy spec of openrlhf_sgrpo.local.models")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error(f"--repeats must be >= 1, got {a.repeats}")

    import torch
    from transformers import AutoModelForCausalLM

    from openrlhf_sgrpo.engine.weight_check import engine_sources
    from openrlhf_sgrpo.engine.weight_sync import write_weights
    from openrlhf_sgrpo.local.models import policy_folder
    from openrlhf_sgrpo.openrlhf_ext.sync_verify import trainer_digests

    model = AutoModelForCausalLM.from_pretrained(policy_folder(a.model), dtype=torch.bfloat16)
    names = engine_sources([n for n, _ in model.named_parameters()])
    params = dict(model.named_parameters())
    wanted = {}
    for name, parts in names.items():
        rows = sum(params[p].shape[0] for p in parts)
        wanted[name] = {((rows, *params[parts[0]].shape[1:]), "torch.bfloat16", "torch.bfloat16")}
    elements = sum(p.numel() for parts in names.values() for p in (params[n] for n in parts))
    args = SimpleNamespace(ds=SimpleNamespace(zero_stage=0))

    def write() -> None:
        write_weights(model.named_parameters()).unlink()

    sync_s = best_of(write, a.repeats)
    check_s = best_of(lambda: trainer_digests(model, wanted, args, digest=True), a.repeats)
    print(f"model {a.model}: {len(names)} engine tensors, {elements / 1e6:.1f} M elements digested, "
          f"{torch.get_num_threads()} torch threads")
    print(f"baseline: the CPU sync's file write   {sync_s:.3f} s")
    print(f"trainer-side digests (one side)       {check_s:.3f} s")
    print(f"ratio digests / sync write: {check_s / sync_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
