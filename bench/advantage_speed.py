"""Advantage speed: stratified_grpo vs OpenRLHF's group_norm, measured in the same run.

512 prompts x 16 samples, strata 0-4. Two ratios are printed:
- end-to-end: OpenRLHF's real RemoteExperienceMaker.compute_advantages_and_returns (group_norm)
  vs our StratifiedExperienceMaker (stratified_grpo) on the same Experience batches: what a
  training step actually pays. Goal <= 1.2x.
- kernel: the per-sample reward shaping alone (our segment-op estimator vs group_norm's
  reshape/mean/std), to show the estimator's own cost.
Importing OpenRLHF's trainer modules on a CPU machine needs import-only stand-ins for vllm and
flash_attn (``openrlhf_sgrpo.testing``, shared with the tests); no GPU code runs.

    .venv/bin/python bench/advantage_speed.py [--prompts 512] [--n 16] [--repeats 7]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from openrlhf_sgrpo.testing import install_gpu_import_stubs


def make_batches(prompts: int, n: int, micro: int, resp_len: int, seed: int = 0) -> list:
    from openrlhf.trainer.ppo_utils.experience import Experience

    g = torch.Generator().manual_seed(seed)
    total = prompts * n
    rewards = torch.randint(0, 2, (total,), generator=g).float()
    strata = torch.randint(0, 5, (total,), generator=g)
    out = []
    for k in range(0, total, micro):
        b = min(micro, total - k)
        out.append(Experience(
            action_mask=torch.ones(b, resp_len, dtype=torch.bool), kl=torch.zeros(b, resp_len),
            rewards=rewards[k:k + b].clone(), response_length=torch.full((b,), resp_len),
            truncated=torch.zeros(b, dtype=torch.bool), index=list(range(k, k + b)),
            info={"tool_calls": strata[k:k + b].clone()}))
    return out


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved(fn_a, fn_b, repeats: int) -> tuple[float, float]:
    """Median times of two functions run alternately, so machine drift hits both alike."""
    fn_a(), fn_b()  # warm-up
    ta, tb = [], []
    for _ in range(repeats):
        for fn, acc in ((fn_a, ta), (fn_b, tb)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--micro", type=int, default=16, help="rollout micro batch (samples per Experience)")
    ap.add_argument("--resp-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=11)
    a = ap.parse_args()
    torch.set_num_threads(1)
    install_gpu_import_stubs()
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from openrlhf_sgrpo.advantages import stratified_advantages
    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    def maker(cls, estimator):
        args = parse_config(["--algo.advantage.estimator", estimator, "--rollout.n_samples_per_prompt", str(a.n)])
        return cls(None, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args), tokenizer=None)

    batches = make_batches(a.prompts, a.n, a.micro, a.resp_len)
    upstream, ours = maker(RemoteExperienceMaker, "group_norm"), maker(StratifiedExperienceMaker, "stratified_grpo")
    t_up, t_ours = interleaved(lambda: upstream.compute_advantages_and_returns(copy.deepcopy(batches)),
                               lambda: ours.compute_advantages_and_returns(copy.deepcopy(batches)), a.repeats)
    t_copy = timed(lambda: copy.deepcopy(batches), a.repeats)

    rewards = torch.cat([b.rewards for b in batches])
    strata = torch.cat([b.info["tool_calls"] for b in batches])

    def group_norm() -> torch.Tensor:  # OpenRLHF 0.11.2's group_norm reward shaping
        r = rewards.reshape(-1, a.n)
        return ((r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-9)).reshape(-1)

    k_up = timed(group_norm, a.repeats * 20)
    k_ours = timed(lambda: stratified_advantages(rewards, strata, a.n, alpha=0.6), a.repeats * 20)

    e2e_up, e2e_ours = t_up - t_copy, t_ours - t_copy
    print(f"batch: {a.prompts} prompts x {a.n} samples, strata 0-4, {len(batches)} experiences of "
          f"{a.micro} x {a.resp_len} tokens (1 thread, median of {a.repeats})")
    print(f"{'path':<46}{'group_norm':>12}{'stratified':>12}{'ratio':>8}")
    print(f"{'end-to-end compute_advantages_and_returns':<46}{e2e_up * 1e3:>10.1f}ms{e2e_ours * 1e3:>10.1f}ms"
          f"{e2e_ours / e2e_up:>7.2f}x   (goal <= 1.2x)")
    print(f"{'reward-shaping kernel only':<46}{k_up * 1e6:>10.0f}us{k_ours * 1e6:>10.0f}us{k_ours / k_up:>7.2f}x")


if __name__ == "__main__":
    main()
