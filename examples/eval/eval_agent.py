"""Evaluate a policy as a search agent on prompt jsonl files (prepare_qa.py's output).

Why a separate driver: OpenRLHF 0.11.2 evaluates only inside a training run (every
--eval.steps). This runs the *same* agent (agent_env's AgentExecutor, the one training loads
through --train.agent_func_path) over a test file, one greedy trajectory per question, and
reports the mean score per ``datasource`` (EM for the QA benchmarks, GAIA's scorer for GAIA).

Engines: ``vllm`` (GPU; vLLM's AsyncLLMEngine, the engine OpenRLHF uses) or ``hf`` (the
single-machine HF-transformers engine, for a small model on CPU).

    python examples/eval/eval_agent.py --model ckpt/ --data test.jsonl --agent-config cfg.yaml --out res.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import uuid
from collections import defaultdict
from pathlib import Path

from tqdm import tqdm


class VLLMEngine:
    """vLLM's AsyncLLMEngine behind the `await generate(token_ids, params)` contract of
    OpenRLHF's agent executors."""

    def __init__(self, model: str, tensor_parallel_size: int, gpu_memory_utilization: float):
        from vllm import AsyncEngineArgs, AsyncLLMEngine

        self.engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(
            model=model, tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization))

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        from vllm.inputs import TokensPrompt

        final = None
        async for out in self.engine.generate(TokensPrompt(prompt_token_ids=prompt_token_ids), sampling_params,
                                              request_id=uuid.uuid4().hex):
            final = out
        return final


def build_engine(a: argparse.Namespace, tokenizer):
    """(engine, SamplingParams class) for --engine."""
    if a.engine == "vllm":
        from vllm import SamplingParams

        return VLLMEngine(a.model, a.tensor_parallel_size, a.gpu_memory_utilization), SamplingParams
    from transformers import AutoModelForCausalLM

    from openrlhf_sgrpo.local import HFGenerationEngine, SamplingParams

    model = AutoModelForCausalLM.from_pretrained(a.model)
    return HFGenerationEngine(model, tokenizer, max_batch=a.concurrency), SamplingParams


def read_rows(path: Path, input_key: str, label_key: str, limit: int) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                row = json.loads(line)
                missing = [k for k in (input_key, label_key) if k not in row]
                if missing:
                    raise ValueError(f"{path}:{lineno}: missing keys {missing} (see --input-key/--label-key)")
                rows.append(row)
    return rows[:limit] if limit else rows


def summarize(results: list[dict]) -> dict:
    """Mean score and count per datasource, plus the question-weighted mean over all."""
    by_source: dict[str, list[float]] = defaultdict(list)
    for r in results:
        by_source[r["datasource"]].append(r["score"])
    per = {k: {"score": sum(v) / len(v), "n": len(v)} for k, v in sorted(by_source.items())}
    total = [r["score"] for r in results]
    return {"per_datasource": per, "overall": {"score": sum(total) / max(len(total), 1), "n": len(total)}}


async def evaluate(rows, executor, engine, tokenizer, params_cls, a) -> list[dict]:
    params = params_cls(temperature=a.temperature, top_p=1.0, max_tokens=a.max_new_tokens,
                        skip_special_tokens=False)
    sem = asyncio.Semaphore(a.concurrency)
    bar = tqdm(total=len(rows), desc="eval", unit=" q")

    async def one(row: dict) -> dict:
        async with sem:
            out = await executor.execute(row[a.input_key], row[a.label_key], params, a.max_len, tokenizer, engine)
        bar.update(1)
        return {"id": row.get("id"), "datasource": row.get("datasource", "default"),
                "score": float(out["scores"]), "extra_logs": out.get("extra_logs", {})}

    try:
        return list(await asyncio.gather(*(one(r) for r in rows)))
    finally:
        bar.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", type=Path, required=True, help="prompt jsonl (prepare_qa.py)")
    p.add_argument("--agent-config", type=Path, required=True, help="agent YAML (examples/configs)")
    p.add_argument("--out", type=Path, required=True, help="results JSON (summary + per-question scores)")
    p.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    p.add_argument("--input-key", default="prompt")
    p.add_argument("--label-key", default="answers")
    p.add_argument("--max-len", type=int, default=4512, help="prompt + all turns, as --data.max_len")
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--concurrency", type=int, default=256, help="trajectories in flight")
    p.add_argument("--limit", type=int, default=0, help="first N rows only (0 = all)")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--dry_run", action="store_true", help="validate inputs, print the settings as JSON, exit")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    from agent_env.config import ConfigError, load_config

    try:
        if not a.data.is_file():
            raise ValueError(f"--data {a.data} does not exist (run examples/data/prepare_qa.py)")
        agent_config = load_config(a.agent_config)
        rows = read_rows(a.data, a.input_key, a.label_key, a.limit)
    except (ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.dry_run:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}
        settings["agent"] = dataclasses.asdict(agent_config)
        settings["rows"] = len(rows)
        settings["datasources"] = sorted({r.get("datasource", "default") for r in rows})
        print(json.dumps(settings, indent=2, default=str))
        return 0

    from transformers import AutoTokenizer

    from agent_env.openrlhf_agent import AgentExecutor

    tokenizer = AutoTokenizer.from_pretrained(a.model)
    engine, params_cls = build_engine(a, tokenizer)
    results = asyncio.run(evaluate(rows, AgentExecutor(agent_config), engine, tokenizer, params_cls, a))
    summary = summarize(results)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"summary": summary, "results": results}, indent=1, default=str))
    for name, m in summary["per_datasource"].items():
        print(f"{name:>20}: {m['score']:.4f}  (n={m['n']})")
    print(f"{'overall':>20}: {summary['overall']['score']:.4f}  (n={summary['overall']['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
