"""The demo's held-out evaluation (agent, retriever, sandbox) with the vLLM engine against the HF engine.

    .venv/bin/python bench/agent_eval_engines.py [--heldout 48] [--engines hf vllm]

``bench/engine_throughput.py`` times bare decoding; this times what a run spends its generation on:
the demo's untrained policy answering its held-out questions greedily, several turns each, every
turn a new request whose prompt holds the turns before it (vLLM's prefix cache skips those; the
HF engine prefills them again), through the demo's own services and rollout code. Printed per
engine: start-up, wall time of the evaluation, engine calls, prompt / cached / output tokens,
and the ratio of HF's wall time to each engine's, measured in this run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class CountingEngine:
    """Wraps an engine's ``generate`` to count calls and tokens (vLLM reports its cached ones)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.calls = self.prompt = self.cached = self.output = 0

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        out = await self.engine.generate(prompt_token_ids, sampling_params, multi_modal_data=multi_modal_data)
        self.calls += 1
        self.prompt += len(prompt_token_ids)
        self.cached += getattr(out, "num_cached_tokens", 0) or 0
        self.output += len(out.outputs[0].token_ids)
        return out

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _one_engine(name: str, heldout: int) -> list:
    from openrlhf_sgrpo.demo.options import TEMPLATE, parse_args
    from openrlhf_sgrpo.demo.stack import evaluate_heldout, make_engine, make_rollout, services
    from openrlhf_sgrpo.demo.questions import load_demo_data
    from openrlhf_sgrpo.local.models import load_policy
    from openrlhf_sgrpo.local.services import cached_index_for

    args = parse_args(["--engine", name, "--heldout", str(heldout)])
    data = load_demo_data(args)
    index = Path(data.index) if data.index else cached_index_for(data.corpus)
    model, tok = load_policy(args.model, "cpu", seed=args.seed)
    with services(args, index, None, TEMPLATE) as (agent_cfg, _):
        start = time.monotonic()
        engine = CountingEngine(make_engine(args, model, tok))
        up = time.monotonic() - start
        rollout = make_rollout(args, engine, tok, agent_cfg)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                start = time.monotonic()
                evaluate_heldout(args, rollout, "bench", data.heldout, Path(tmp) / "predictions.jsonl",
                                 Path(tmp), "eval_before", 0)
                wall = time.monotonic() - start
        finally:
            rollout.close()
            engine.close()
    cached = f"{engine.cached:,}" if name == "vllm" else "-"
    return [name, f"{up:.1f}", f"{wall:.1f}", engine.calls, f"{engine.prompt:,}", cached, f"{engine.output:,}"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heldout", type=int, default=48, help="held-out questions (half two-hop)")
    p.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    args = p.parse_args()
    if args.heldout < 2:
        p.error(f"--heldout must be >= 2, got {args.heldout}")
    from openrlhf_sgrpo.engine import vllm_unavailable_reason
    from openrlhf_sgrpo.eval.table import format_table

    if "vllm" in args.engines and vllm_unavailable_reason():
        print(f"vLLM cannot run here ({vllm_unavailable_reason()}): nothing to compare", file=sys.stderr)
        return 2
    rows = [_one_engine(name, args.heldout) for name in args.engines]
    base = float(rows[0][2])
    for row in rows:
        row.append(f"{base / float(row[2]):.2f}")
    print(f"the demo's held-out evaluation, {args.heldout} questions, untrained policy, greedy")
    print(format_table(["engine", "start s", "wall s", "calls", "prompt tokens", "cached", "output tokens",
                        f"x {rows[0][0]}"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
