"""Output tokens per second of the vLLM engine against the project's HF engine, same prompts, one run.

    .venv/bin/python bench/engine_throughput.py [--model smollm2] [--prompts 32] [--tokens 128]

Both engines serve the same ``--prompts`` chat prompts, all in flight at once (as a rollout sends
them), sampling exactly ``--tokens`` new tokens each (``ignore_eos``), and the bench prints
tokens/s of each and the ratio vLLM / HF (the goal of issue #23: >= 5x on a 2-core CPU). The HF
engine runs the model as the runner trains it (fp32, ``load_policy``); vLLM runs it in
``--vllm-dtype`` (each listed dtype is one more vLLM column). Engine start-up (vLLM: ~1 min on
2 cores) is reported beside, not counted in the rate. Also timed: one weight sync of the policy
into vLLM (:mod:`openrlhf_sgrpo.engine.weight_sync`), which the runner pays once per step.

On a CPU our engine runs vLLM's worker inside the engine-core process (``engine/vllm.py``); the
first dtype also runs in vLLM's default layout (a worker process of its own) for the same prompts,
and the memory of the engine's processes after generating is printed for each (RSS and PSS:
shared pages once), so the one-process layout's saving and its speed are measured in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _prompts(tok, n: int) -> list[list[int]]:
    topics = ["a lighthouse", "the river Nile", "a chess match", "Mount Fuji", "a bakery", "the moon landing",
              "a violin", "Antarctica"]
    out = []
    for i in range(n):
        msg = [{"role": "user", "content": f"Write a short story about {topics[i % len(topics)]} (number {i})."}]
        text = tok.apply_chat_template(msg, tokenize=False, add_generation_prompt=True) \
            if getattr(tok, "chat_template", None) else msg[0]["content"]
        out.append(tok(text, add_special_tokens=False).input_ids)
    return out


def _measure(engine, prompts: list[list[int]], tokens: int) -> tuple[int, float]:
    from openrlhf_sgrpo.engine.sampling import SamplingParams

    params = SamplingParams(temperature=1.0, max_tokens=tokens, ignore_eos=True)

    async def all_at_once():
        return await asyncio.gather(*[engine.generate(p, params) for p in prompts])

    start = time.monotonic()
    outs = asyncio.run(all_at_once())
    wall = time.monotonic() - start
    return sum(len(o.outputs[0].token_ids) for o in outs), wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="smollm2 | tiny-qwen2 | a local HF folder")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=128, help="new tokens per prompt")
    p.add_argument("--vllm-dtype", nargs="+", default=["float32", "bfloat16"])
    args = p.parse_args()
    for name in ("prompts", "tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")

    from openrlhf_sgrpo.engine import build_engine, vllm_unavailable_reason
    from openrlhf_sgrpo.eval.table import format_table
    from openrlhf_sgrpo.local.models import load_policy, policy_folder

    reason = vllm_unavailable_reason()
    if reason:
        print(f"vLLM cannot run here ({reason}): nothing to compare", file=sys.stderr)
        return 2
    model, tok = load_policy(args.model)
    folder = policy_folder(args.model)
    prompts = _prompts(tok, args.prompts)
    rows = []

    start = time.monotonic()
    hf = build_engine("hf", model, tok, max_batch=args.prompts)
    hf_start = time.monotonic() - start
    n, wall = _measure(hf, prompts, args.tokens)
    hf_rate = n / wall
    rows.append(["hf (fp32, batched transformers)", f"{hf_start:.1f}", n, f"{wall:.1f}", f"{hf_rate:.1f}",
                 "1.00", "-", "-"])
    layouts = [(dtype, False) for dtype in args.vllm_dtype] + [(args.vllm_dtype[0], True)]
    for dtype, separate in layouts:
        start = time.monotonic()
        engine = build_engine("vllm", model, tok, model_path=folder, max_batch=args.prompts,
                              max_model_len=max(len(x) for x in prompts) + args.tokens + 8, dtype=dtype,
                              enforce_eager=True, separate_cpu_worker=separate)
        up = time.monotonic() - start
        if separate and not engine.on_cpu:
            engine.close()
            break  # one layout on a GPU
        try:
            n, wall = _measure(engine, prompts, args.tokens)
            memory = _engine_memory()
            sync_start = time.monotonic()
            engine.sync_weights(model)
            sync = time.monotonic() - sync_start
        finally:
            engine.close()
        label = f"vllm ({dtype}, CPU build{', worker process of its own' if separate else ''})" \
            if engine.on_cpu else f"vllm ({dtype})"
        rows.append([label, f"{up:.1f}", n, f"{wall:.1f}", f"{n / wall:.1f}", f"{n / wall / hf_rate:.2f}",
                     f"{sync:.2f}", memory])
    print(f"{args.prompts} prompts x {args.tokens} new tokens, {args.model}")
    print(format_table(["engine", "start s", "tokens", "wall s", "tokens/s", "x HF", "weight sync s",
                        "engine processes RSS / PSS MiB"], rows))
    return 0


def _engine_memory() -> str:
    """RSS / PSS of this process's descendants: the engine's processes (the HF engine has none)."""
    from openrlhf_sgrpo.demo.memory import tree_memory_mb

    rss, pss = tree_memory_mb(include_self=False)
    return f"{rss:.0f} / {pss:.0f}"


if __name__ == "__main__":
    sys.exit(main())
