"""What a per-request seed costs the HF fallback engine: seeded against unseeded sampling, one run.

    .venv/bin/python bench/hf_seeded_sampling.py [--model smollm2] [--prompts 16] [--tokens 32]

The local trainer seeds every request (``SeededCalls``: call k of trajectory j samples from its own
generator), so a seeded batch is the HF engine's normal case. Two figures, each a ratio against
the unseeded baseline measured in the same run:

- the sampler alone (``HFGenerationEngine._sample``) on one decode step's logits of ``--prompts``
  rows: ms per step, seeded / unseeded;
- whole generations (``generate``, all prompts in flight, ``--tokens`` new tokens each, EOS
  ignored): tokens per second, seeded / unseeded, alternating ``--repeats`` times so drift in the
  machine's speed falls on both.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _prompts(tok, n: int) -> list[list[int]]:
    return [tok(f"Question {i}: who wrote the novel number {i} on the list, and when?",
                add_special_tokens=False).input_ids for i in range(n)]


def _sampler_ms(engine, logits, reqs, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine._sample(logits.clone(), reqs)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="smollm2 | tiny-qwen2 | a local HF folder")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--tokens", type=int, default=32, help="new tokens per prompt")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    for name in ("prompts", "tokens", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")

    import torch

    from openrlhf_sgrpo.engine.hf import HFGenerationEngine, _Request
    from openrlhf_sgrpo.engine.sampling import SamplingParams
    from openrlhf_sgrpo.local.models import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(args.model)
    engine = HFGenerationEngine(model, tok, max_batch=args.prompts)
    prompts = _prompts(tok, args.prompts)

    def params(seed: int | None) -> SamplingParams:
        return SamplingParams(temperature=1.0, max_tokens=args.tokens, ignore_eos=True, seed=seed)

    # the sampler alone, on real logits
    vocab = model.config.vocab_size
    logits = torch.randn(args.prompts, vocab) * 3
    rows = {}
    for label, seeded in (("unseeded", False), ("seeded", True)):
        reqs = [_Request(pr, params(i if seeded else None), None) for i, pr in enumerate(prompts)]
        for r in reqs:
            if r.params.seed is not None:
                r.generator = torch.Generator().manual_seed(r.params.seed)
        _sampler_ms(engine, logits, reqs, 3)  # warm
        rows[label] = _sampler_ms(engine, logits, reqs, 30)
    print(f"sampler, {args.prompts} rows x {vocab} vocabulary: unseeded {rows['unseeded']:.2f} ms/step, "
          f"seeded {rows['seeded']:.2f} ms/step, seeded / unseeded {rows['seeded'] / rows['unseeded']:.2f}")

    async def generate(seeded: bool) -> float:
        start = time.perf_counter()
        outs = await asyncio.gather(*[engine.generate(pr, params(i if seeded else None))
                                      for i, pr in enumerate(prompts)])
        seconds = time.perf_counter() - start
        return sum(len(o.outputs[0].token_ids) for o in outs) / seconds

    rates: dict[str, list[float]] = {"unseeded": [], "seeded": []}
    asyncio.run(generate(False))  # warm
    for _ in range(args.repeats):
        for label, seeded in (("unseeded", False), ("seeded", True)):
            rates[label].append(asyncio.run(generate(seeded)))
    un, se = statistics.median(rates["unseeded"]), statistics.median(rates["seeded"])
    print(f"generate, {args.prompts} prompts x {args.tokens} tokens ({args.model}, median of {args.repeats}): "
          f"unseeded {un:.1f} tok/s, seeded {se:.1f} tok/s, seeded / unseeded {se / un:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
