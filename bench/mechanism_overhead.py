"""Mechanism overhead: the per-stratum advantage mass (openrlhf_sgrpo.mechanism) vs the advantage
computation it reports on, measured in the same run on the same batch.

Both experience makers now call :func:`estimator_mechanism` once per step beside the estimator
(two more estimator passes, for the stratum and group terms, then five segment sums). Printed:
its time as a ratio of ``stratified_advantages`` alone (the advantage computation), and of the
whole stratified step's monitors (``stratification_metrics``), for the same rewards and strata.
Ratios only: absolute times depend on the machine and are printed for reading, never asserted.

    .venv/bin/python bench/mechanism_overhead.py [--prompts 512] [--n 16] [--repeats 200]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_records_overhead import interleaved  # noqa: E402  (median of each, run in turn)
from openrlhf_sgrpo.advantages import stratified_advantages  # noqa: E402
from openrlhf_sgrpo.mechanism import estimator_mechanism  # noqa: E402
from openrlhf_sgrpo.metrics import stratification_metrics  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=200)
    a = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    total = a.prompts * a.n
    rewards = torch.randint(0, 2, (total,), generator=g).float()
    calls = torch.randint(0, 6, (total,), generator=g)
    fns = [
        lambda: stratified_advantages(rewards, calls, a.n, alpha=0.6),
        lambda: estimator_mechanism("stratified_grpo", rewards, calls, calls, a.n, 0.6),
        lambda: stratification_metrics(rewards, calls, a.n),
    ]
    for fn in fns:
        fn()  # warm-up
    t_adv, t_mech, t_mon = interleaved(fns, a.repeats)
    print(f"batch: {a.prompts} prompts x {a.n} samples, tool calls 0-5 (1 thread, median of {a.repeats})")
    print(f"stratified_advantages        {t_adv * 1e6:9.0f} us   1.00x")
    print(f"estimator_mechanism          {t_mech * 1e6:9.0f} us {t_mech / t_adv:6.2f}x of the advantages")
    print(f"stratification_metrics       {t_mon * 1e6:9.0f} us {t_mon / t_adv:6.2f}x of the advantages")
    print(f"mechanism / monitors: {t_mech / t_mon:.2f}x")


if __name__ == "__main__":
    main()
