"""The runner's experience + update time with one optimizer step per rollout: the update scoring
with its own forward (old log-probs from it, micro-batches grouped by length) vs the previous
path (a separate no-grad pass for the old log-probs, micro-batches in shuffled group order), same
run, same samples.

    .venv/bin/python bench/update_old_logprobs.py [--model smollm2] [--samples 8] [--min-tokens 300]
                                                  [--max-tokens 600] [--repeats 2]

Samples are token sequences of lengths spread between ``--min-tokens`` and ``--max-tokens`` (the
demo's rollouts span one- and two-search trajectories), the second half of each an action span,
with rewards and tool calls that give every group reward spread and two strata. Each path runs
``make_experience`` and ``_ppo_train`` of :class:`openrlhf_sgrpo.local.trainer.LocalTrainer` on a
fresh copy of the same weights, ``--repeats`` times alternately; the best time of each is printed
with the ratio new / previous (below 1: faster).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openrlhf_sgrpo.local.trainer import TrainConfig  # noqa: E402


@dataclass(frozen=True)
class _PreviousPath(TrainConfig):
    """The same settings, taking the path the runner took before: a separate old-log-prob pass and
    shuffled group order."""

    @property
    def single_update(self) -> bool:
        return False


def _samples(vocab: int, n: int, lo: int, hi: int, seed: int):
    import torch

    from openrlhf_sgrpo.local.experience import tensorize_response

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = lo + (hi - lo) * i // max(1, n - 1)
        tokens = torch.randint(0, vocab, (length,), generator=g).tolist()
        response = {"observation_tokens": tokens, "action_ranges": [(length // 2, length)],
                    "reward": float(i % 2), "extra_logs": {"tool_calls": (i // 2) % 2}}
        out.append(tensorize_response(response, hi))
    return out


def _run(cfg: TrainConfig, model, tok, samples) -> float:
    from openrlhf_sgrpo.local.data import Question
    from openrlhf_sgrpo.local.experience_maker import make_experience
    from openrlhf_sgrpo.local.trainer import LocalTrainer

    with TemporaryDirectory() as tmp:
        trainer = LocalTrainer(copy.deepcopy(model), tok, None, [Question("q", "q?", ["a"])], cfg, Path(tmp))
        start = time.monotonic()
        exp = make_experience(samples, cfg.n_samples, cfg.adv, trainer.model, trainer.pad_id,
                              cfg.micro_batch_size, old_from_update=cfg.single_update)
        trainer._ppo_train(exp, step=1)
        return time.monotonic() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--samples", type=int, default=8, help="rollout size: 2 prompts x samples/2")
    p.add_argument("--min-tokens", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=600)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    if args.samples < 4 or args.samples % 2:
        p.error(f"--samples must be an even number >= 4, got {args.samples}")
    if not 2 <= args.min_tokens <= args.max_tokens:
        p.error(f"need 2 <= --min-tokens <= --max-tokens, got {args.min_tokens}, {args.max_tokens}")
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")

    from openrlhf_sgrpo.eval.table import format_table
    from openrlhf_sgrpo.local.models import load_policy

    model, tok = load_policy(args.model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    samples = _samples(model.config.vocab_size, args.samples, args.min_tokens, args.max_tokens, seed=0)
    settings = dict(prompts_per_step=2, n_samples=args.samples // 2, micro_batch_size=2, lr=1e-6,
                    gradient_checkpointing=True)
    paths = {"own forward, length-grouped (now)": TrainConfig(**settings),
             "separate old pass, group order (before)": _PreviousPath(**settings)}
    best = {name: float("inf") for name in paths}
    for _ in range(args.repeats):
        for name, cfg in paths.items():
            best[name] = min(best[name], _run(cfg, model, tok, samples))
    now, before = best.values()
    print(f"{args.model}: {args.samples} samples of {args.min_tokens}-{args.max_tokens} tokens, "
          f"micro-batches of 2, gradient checkpointing, one optimizer step; best of {args.repeats}")
    print(format_table(["path", "experience + update s", "x before"],
                       [[name, f"{s:.1f}", f"{s / before:.2f}"] for name, s in best.items()]))
    print(f"ratio now / before: {now / before:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
