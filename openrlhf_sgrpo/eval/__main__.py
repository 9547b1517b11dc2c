"""``python -m openrlhf_sgrpo.eval``: a model as a search agent over QA datasets or GAIA.

    python -m openrlhf_sgrpo.eval --model smollm2 --corpus corpus.jsonl \\
        --data hotpotqa=../shared/data/hotpotqa/train_hipporag100.jsonl --data nq.jsonl --limit 50
    python -m openrlhf_sgrpo.eval --model /ckpt/qwen --engine vllm --agent-config agent.yaml \\
        --data test.jsonl --gaia GAIA/2023/validation/metadata.jsonl

Prints a per-dataset EM / F1 / search-calls table (GAIA: accuracy per level with the GAIA
scorer), writes ``<out>/predictions.jsonl`` and ``<out>/summary.json``; rerunning with the same
``--out`` skips questions already answered. The one evaluation driver: the example scripts
(``examples/eval/eval_qa.sh``, ``examples/qwen3-8b/eval_gaia.sh``) call it through
``run_eval`` in ``examples/lib/launch.sh``; ``--dry-run`` checks the inputs and prints the
resolved settings as JSON without loading a model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from pathlib import Path

from agent_env.config import ConfigError
from openrlhf_sgrpo.engine.vllm import VLLMUnavailable
from openrlhf_sgrpo.local.data import DataError, Question, load_qa_jsonl

log = logging.getLogger("openrlhf_sgrpo.eval")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m openrlhf_sgrpo.eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="smollm2 | tiny-qwen2 | a local HF model folder")
    p.add_argument("--device", default="cpu", help="HF engine device (cpu, cuda, cuda:1, ...)")
    p.add_argument("--engine", choices=("auto", "vllm", "hf"), default="auto",
                   help="vllm: vLLM's AsyncLLMEngine (its CPU build on a CPU); hf: batched transformers "
                        "generation, the fallback; auto (default): vllm where it runs, else hf with the reason")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vLLM engine on a GPU only")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM engine only: GPUs per model")
    p.add_argument("--data", action="append", default=[], metavar="[NAME=]PATH",
                   help="jsonl of {question, golden_answers (FlashRAG) or answers (prepare_qa.py)}; rows with "
                        "a 'datasource' are reported per datasource; repeat for several files")
    p.add_argument("--gaia", metavar="METADATA_JSONL", help="GAIA mode: metadata.jsonl (search + code tools)")
    p.add_argument("--limit", type=int, default=None, help="first N questions of each dataset")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--retriever-url", help="an already running /retrieve endpoint")
    src.add_argument("--index", help="a retriever index folder (served on loopback for this run)")
    src.add_argument("--corpus", help="a corpus jsonl {id, contents}: indexed with MiniLM (cached), then served")
    p.add_argument("--agent-config", default=None, metavar="YAML",
                   help="agent settings (examples/configs/*.yaml); the flags below override them")
    p.add_argument("--search-backend", choices=("local", "web"), default=None, help="default: local")
    p.add_argument("--web-search-url", default=None, help="web search proxy URL (search backend 'web')")
    p.add_argument("--sandbox-url", default=None, help="an already running /run_code endpoint")
    p.add_argument("--no-sandbox", action="store_true", help="do not start the local sandbox (GAIA needs code)")
    p.add_argument("--template", default=None, help="prompt template (default: search_r1_chat; GAIA: deep_research)")
    p.add_argument("--max-turns", type=int, default=None, help="default: 4")
    p.add_argument("--topk", type=int, default=None, help="default: 3")
    p.add_argument("--max-obs-tokens", type=int, default=None, help="tokens per tool observation (default 500)")
    p.add_argument("--max-len", type=int, default=2048, help="context budget per trajectory (tokens)")
    p.add_argument("--max-tokens-per-turn", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=16, help="questions in flight at once")
    p.add_argument("--out", default="runs/eval", help="output folder (resumable)")
    p.add_argument("--rollout-records", action=argparse.BooleanOptionalAction, default=True,
                   help="also append each trajectory to OUT/rollouts/eval/ for python -m openrlhf_sgrpo.inspect OUT")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--dry-run", action="store_true", help="check the inputs, print the settings as JSON, exit")
    args = p.parse_args(argv)
    if not args.data and not args.gaia:
        p.error("name at least one dataset with --data PATH, or --gaia METADATA_JSONL")
    for name in ("limit", "max_turns", "topk", "max_obs_tokens", "max_len", "max_tokens_per_turn", "concurrency",
                 "tensor_parallel_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not 0 < args.gpu_memory_utilization <= 1:
        p.error(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    if (args.search_backend or "local") == "local" and not (args.retriever_url or args.index or args.corpus
                                                            or args.agent_config):
        p.error("name a retriever: --retriever-url URL, --index DIR, --corpus JSONL or --agent-config YAML "
                "(or --search-backend web)")
    return args


def datasets_from_args(args: argparse.Namespace) -> dict[str, list[Question]]:
    """Datasets by name: ``NAME=PATH`` (or the file's folder/stem), or each row's ``datasource``."""
    out: dict[str, list[Question]] = {}
    for spec in args.data:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        name = name or Path(path).parent.name + "/" + Path(path).stem
        for source, questions in load_qa_jsonl(path).items():
            key = source or name
            if key in out:
                raise DataError(f"dataset name {key!r} given twice; use NAME=PATH to tell them apart")
            out[key] = questions[: args.limit] if args.limit else questions
    return out


@contextlib.contextmanager
def _services(args: argparse.Namespace, need_sandbox: bool):
    from openrlhf_sgrpo.local.services import ServiceUrls, cached_index_for, local_services

    index = cached_index_for(args.corpus, progress=not args.quiet) if args.corpus else args.index
    start_sandbox = need_sandbox and not args.sandbox_url and not args.no_sandbox
    with local_services(index, sandbox=start_sandbox, topk=args.topk or 3) as urls:
        yield ServiceUrls(args.retriever_url or urls.retriever_url, args.sandbox_url or urls.sandbox_url)


def agent_config(args: argparse.Namespace, urls, gaia: bool):
    """``--agent-config`` (or the defaults), then every flag that was given, then the URLs of the
    services this run started. GAIA is scored with the GAIA scorer and, unless a template is
    named, the deep-research prompt."""
    import dataclasses

    from agent_env.config import AgentConfig, load_config

    base = load_config(args.agent_config) if args.agent_config else AgentConfig(template="search_r1_chat")
    given = {"search_backend": args.search_backend, "web_search_url": args.web_search_url,
             "template": args.template, "max_turns": args.max_turns, "topk": args.topk,
             "max_obs_tokens": args.max_obs_tokens, "retriever_url": urls.retriever_url,
             "sandbox_url": urls.sandbox_url}
    changes = {k: v for k, v in given.items() if v is not None}
    if gaia:
        changes["reward"] = "gaia"
        if args.template is None and not args.agent_config:
            changes["template"] = "deep_research"
    return dataclasses.replace(base, **changes)


def _by_level(records: list[dict], levels: dict[str, str]) -> dict[str, dict]:
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(levels.get(r["id"], "?"), []).append(r)
    groups["all"] = records
    out = {}
    for level, rows in sorted(groups.items(), key=lambda kv: (kv[0] == "all", kv[0])):
        n = len(rows)
        out[level] = {"n": n, "accuracy": sum(r["score"] for r in rows) / n if n else 0.0,
                      "search_calls": sum(r["search_calls"] for r in rows) / n if n else 0.0,
                      "code_calls": sum(r["code_calls"] for r in rows) / n if n else 0.0}
    return out


def _engine(args: argparse.Namespace):
    """(engine with the `generate` contract, tokenizer) for --engine auto, vllm or hf."""
    from openrlhf_sgrpo.engine import build_engine, resolve_engine
    from openrlhf_sgrpo.local.models import load_policy, policy_folder

    name, note = resolve_engine(args.engine)  # fails before loading or serving anything
    if note:
        print(note, file=sys.stderr)
    args.engine = name
    if name == "hf":
        model, tok = load_policy(args.model, args.device)
        return build_engine("hf", model, tok, max_batch=max(args.concurrency, 1)), tok
    from transformers import AutoTokenizer

    folder = policy_folder(args.model)  # vLLM serves the saved folder as it is
    engine = build_engine("vllm", None, None, model_path=folder, max_batch=max(args.concurrency, 1),
                          max_model_len=args.max_len, gpu_memory_utilization=args.gpu_memory_utilization,
                          tensor_parallel_size=args.tensor_parallel_size)
    return engine, AutoTokenizer.from_pretrained(str(folder))


def run(args: argparse.Namespace) -> dict:
    from openrlhf_sgrpo.eval.core import TrajectoryRecords, evaluate, summarize
    from openrlhf_sgrpo.eval.gaia import load_gaia
    from openrlhf_sgrpo.eval.table import gaia_table, qa_table
    from openrlhf_sgrpo.local.rollout import AgentRollout

    datasets = datasets_from_args(args)
    gaia_questions, levels = load_gaia(args.gaia) if args.gaia else ([], {})
    if args.dry_run:
        return dry_run(args, datasets, gaia_questions)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    engine, tok = _engine(args)
    records = TrajectoryRecords(out) if args.rollout_records else None
    summary: dict = {"model": args.model, "engine": args.engine}
    with contextlib.ExitStack() as stack:
        stack.callback(engine.close)  # vLLM's engine holds processes, memory and a loop thread
        urls = stack.enter_context(_services(args, need_sandbox=bool(gaia_questions)))
        if datasets:
            rollout = AgentRollout(engine, tok, agent_config(args, urls, gaia=False), args.max_len,
                                   args.max_tokens_per_turn)
            try:
                qa = {name: summarize(evaluate(rollout, name, qs, out / "predictions.jsonl", args.concurrency,
                                               not args.quiet, records)) for name, qs in datasets.items()}
            finally:
                rollout.close()
            summary["qa"] = qa
            print(qa_table(qa))
        if gaia_questions:
            rollout = AgentRollout(engine, tok, agent_config(args, urls, gaia=True), args.max_len,
                                   args.max_tokens_per_turn)
            try:
                gaia = evaluate(rollout, "gaia", gaia_questions, out / "predictions.jsonl", args.concurrency,
                                not args.quiet, records)
            finally:
                rollout.close()
            summary["gaia"] = _by_level(gaia, levels)
            print(gaia_table(summary["gaia"]))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {out / 'summary.json'} and {out / 'predictions.jsonl'}")
    if records is not None:
        print(f"trajectories: python -m openrlhf_sgrpo.inspect {out}")
    return summary


def dry_run(args: argparse.Namespace, datasets: dict[str, list[Question]], gaia_questions: list[Question]) -> dict:
    """The settings this call would run with, as JSON on stdout (no model, no services)."""
    import dataclasses

    from openrlhf_sgrpo.local.services import ServiceUrls

    urls = ServiceUrls(args.retriever_url, args.sandbox_url)
    settings = {k: v for k, v in vars(args).items() if k not in ("data",)}
    settings["datasets"] = {name: len(qs) for name, qs in datasets.items()}
    settings["gaia_questions"] = len(gaia_questions)
    if datasets:
        settings["agent"] = dataclasses.asdict(agent_config(args, urls, gaia=False))
    if gaia_questions:
        settings["gaia_agent"] = dataclasses.asdict(agent_config(args, urls, gaia=True))
    print(json.dumps(settings, indent=1, default=str))
    return settings


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    from openrlhf_sgrpo.local.stop_signal import SigtermInterrupts
    from sandbox.process import SandboxStartError

    try:
        with SigtermInterrupts():  # a scheduler's kill: the engine and the services shut, as on Ctrl-C
            run(args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (DataError, ConfigError, FileNotFoundError, VLLMUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except SandboxStartError as err:
        if not err.environment_missing:
            raise
        # GAIA's <code> needs a sandbox; the local one refuses weaker isolation (above: why). Without
        # root that is its memory limit, which needs a cgroup the user may write.
        print(f"error: the local code sandbox did not start ({err}); its reason is printed above. Pass "
              "--sandbox-url URL of a sandbox you run (e.g. python -m sandbox.serve --backend local --port 8080 "
              "--allow-weaker-isolation, or the compose stack's), or --no-sandbox to answer <code> with an "
              "error observation", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
