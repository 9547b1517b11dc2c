"""``python -m openrlhf_sgrpo.ask``: ask a (trained) model one question and print its trajectory.

    python -m openrlhf_sgrpo.ask --model runs/sgrpo-qwen2.5-3b-base/model \\
        --retriever-url http://127.0.0.1:8000/retrieve "Who wrote the novel Dracula?"
    python -m openrlhf_sgrpo.ask --model smollm2 --checkpoint runs/<id>/checkpoints \\
        --corpus corpus.jsonl "Which river flows through the town where Thomix Brasos was born?"

Search-R1's ``infer.py`` in this repository's terms: the same agent as training and evaluation
(``agent_env``: its parser, episode rules, observations and tools), one greedy trajectory, and every
turn printed as it was, with what the tool answered. The model is an HF folder (the cluster
scripts' ``$SAVE_PATH/model``), or ``smollm2`` / ``tiny-qwen2`` with ``--checkpoint`` pointing at
the single-machine runner's checkpoints (``make demo``'s ``runs/<id>/checkpoints``). The retriever
is one already running (``--retriever-url``, e.g. the compose stack's) or one served on loopback
for this call (``--index`` a folder, ``--corpus`` a jsonl indexed with MiniLM). ``--gold`` scores
the answer as the evaluation does (EM, F1).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

from agent_env.config import ConfigError
from openrlhf_sgrpo.engine.vllm import VLLMUnavailable

RULE = "-" * 78


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m openrlhf_sgrpo.ask", description=__doc__.split("\n\n")[0],
                                epilog="Prints each turn: the policy's text, then the tool's answer.")
    p.add_argument("question", help="the question, as one argument (quote it)")
    p.add_argument("--model", default="smollm2", help="a local HF model folder, or smollm2 | tiny-qwen2")
    p.add_argument("--checkpoint", default=None,
                   help="the single-machine runner's checkpoint of --model: a step_<k> folder, or the folder "
                        "holding them (the latest is taken), e.g. runs/<id>/checkpoints")
    p.add_argument("--engine", choices=("auto", "vllm", "hf"), default="auto",
                   help="vllm (its CPU build on a CPU), hf (transformers), or auto: vllm where it runs")
    p.add_argument("--device", default="cpu", help="HF engine device (cpu, cuda, ...)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--retriever-url", help="a running /retrieve endpoint (any server speaking Search-R1's API)")
    src.add_argument("--index", help="a retriever index folder, served on loopback for this call")
    src.add_argument("--corpus", help="a corpus jsonl {id, contents}: indexed with MiniLM (cached), then served")
    p.add_argument("--agent-config", default=None, metavar="YAML",
                   help="agent settings (examples/configs/*.yaml); the flags below override them")
    p.add_argument("--template", default=None,
                   help="prompt template: search_r1_chat (default: instruct and chat models), search_r1_base "
                        "(base models, as the paper's base runs), deep_research (search and code)")
    p.add_argument("--sandbox-url", default=None, help="a running /run_code endpoint (deep_research's <code>)")
    p.add_argument("--max-turns", type=int, default=None, help="default 4 (the agent config's)")
    p.add_argument("--topk", type=int, default=None, help="passages per search (default 3)")
    p.add_argument("--max-len", type=int, default=4096, help="context budget of the trajectory, tokens")
    p.add_argument("--max-tokens-per-turn", type=int, default=500)
    p.add_argument("--gold", action="append", default=[], help="a gold answer (repeat): prints EM and F1")
    p.add_argument("--json", action="store_true", help="print the trajectory as one JSON object instead")
    args = p.parse_args(argv)
    if not args.question.strip():
        p.error("the question is empty")
    for name in ("max_turns", "topk", "max_len", "max_tokens_per_turn"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not (args.retriever_url or args.index or args.corpus or args.agent_config):
        p.error("name a retriever: --retriever-url URL, --index DIR, --corpus JSONL or --agent-config YAML")
    if args.checkpoint is not None and not Path(args.checkpoint).is_dir():
        p.error(f"--checkpoint {args.checkpoint!r} is not a folder")
    return args


def checkpoint_weights(path: str | Path) -> Path:
    """The weights file of a runner checkpoint: ``step_<k>/model.pt``, or the latest step under ``path``."""
    from openrlhf_sgrpo.local.checkpoint import WEIGHTS_FILE, latest_checkpoint

    path = Path(path)
    step = path if (path / WEIGHTS_FILE).is_file() else latest_checkpoint(path)
    if step is None or not (step / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"--checkpoint {path}: no {WEIGHTS_FILE} there, nor a complete step_<k> "
                                "checkpoint below it")
    return step / WEIGHTS_FILE


def build_engine_for(args: argparse.Namespace):
    """(engine, tokenizer): the model as an HF folder, or an embedded one with the checkpoint's weights
    (vLLM serves the embedded model's folder and then takes the weights by the engine's own sync)."""
    import torch

    from openrlhf_sgrpo.engine import build_engine, resolve_engine
    from openrlhf_sgrpo.local.models import load_policy, policy_folder

    name, note = resolve_engine(args.engine)
    if note:
        print(note, file=sys.stderr)
    model = tok = None
    if name == "hf" or args.checkpoint:
        model, tok = load_policy(args.model, args.device)
        if args.checkpoint:
            weights = checkpoint_weights(args.checkpoint)
            model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
            print(f"weights: {weights}", file=sys.stderr)
    if name == "hf":
        return build_engine("hf", model, tok, max_batch=1), tok
    from transformers import AutoTokenizer

    folder = policy_folder(args.model)
    engine = build_engine("vllm", model, tok, model_path=folder, max_batch=1, max_model_len=args.max_len,
                          enforce_eager=True)
    if model is not None:
        engine.sync_weights(model)
    return engine, tok or AutoTokenizer.from_pretrained(str(folder))


def agent_config(args: argparse.Namespace, retriever_url: str | None):
    from agent_env.config import AgentConfig, load_config

    base = load_config(args.agent_config) if args.agent_config else AgentConfig(template="search_r1_chat")
    given = {"template": args.template, "max_turns": args.max_turns, "topk": args.topk,
             "retriever_url": retriever_url, "sandbox_url": args.sandbox_url}
    return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})


def trajectory(sample, tokenizer, question: str, golds: list[str]) -> dict:
    """The printed facts of one trajectory: every turn (text, kind, query, tool output), the answer."""
    from agent_env import info_keys as K
    from openrlhf_sgrpo.eval.core import final_answer
    from openrlhf_sgrpo.rollout_records.build import RecordLimits, Trajectory, turn_records

    limits = RecordLimits(text_chars=1 << 20, output_chars=1 << 20, question_chars=1 << 20)
    turns = turn_records(Trajectory(sample.sequences.tolist(), sample.info, sample.reward), tokenizer, limits)
    out = {"question": question, "answer": final_answer(sample, tokenizer),
           "turns": [{"kind": t["kind"], "text": t["text"], "query": t["query"], "output": t["output"]}
                     for t in turns],
           "search_calls": sample.info.get(K.SEARCH_CALLS, 0.0), "truncated": sample.truncated}
    if golds:
        out.update(golds=golds, em=sample.info.get(K.EM, 0.0), f1=sample.info.get(K.F1, 0.0))
    return out


def format_trajectory(t: dict) -> str:
    """The trajectory for a terminal: numbered turns, the tool's answer indented under each."""
    lines = [f"question: {t['question']}", RULE]
    for k, turn in enumerate(t["turns"], 1):
        head = f"[turn {k}: {turn['kind']}" + (f" {turn['query']!r}" if turn["query"] and turn["kind"] != "answer" else "")
        lines.append(head + "]")
        lines.append(turn["text"].rstrip())
        if turn["output"].strip():
            lines.append("  " + turn["output"].strip().replace("\n", "\n  "))
        lines.append(RULE)
    tail = f"answer: {t['answer'] if t['answer'] is not None else '(none: the agent did not answer)'}"
    tail += f"   searches: {t['search_calls']:g}"
    if "em" in t:
        tail += f"   EM {t['em']:.0f}  F1 {t['f1']:.2f} against {t['golds']}"
    if t["truncated"]:
        tail += "   (cut at --max-len)"
    return "\n".join(lines + [tail])


def ask(args: argparse.Namespace) -> dict:
    from openrlhf_sgrpo.local.rollout import AgentRollout
    from openrlhf_sgrpo.local.services import cached_index_for, local_services

    engine, tok = build_engine_for(args)
    with contextlib.ExitStack() as stack:
        stack.callback(engine.close)
        index = cached_index_for(args.corpus) if args.corpus else args.index
        urls = stack.enter_context(local_services(index, sandbox=False, topk=args.topk or 3))
        cfg = agent_config(args, args.retriever_url or urls.retriever_url)
        rollout = AgentRollout(engine, tok, cfg, args.max_len, args.max_tokens_per_turn)
        got = []
        try:
            rollout.run_each([args.question], [args.gold], 1, lambda _i, sample: got.append(sample), greedy=True,
                             desc="ask", progress=False)
        finally:
            rollout.close()
    return trajectory(got[0], tok, args.question, args.gold)


def main(argv: list[str] | None = None) -> int:
    import logging
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from openrlhf_sgrpo.local.stop_signal import SigtermInterrupts

    args = parse_args(argv)
    try:
        with SigtermInterrupts():  # a scheduler's kill: the engine and the services shut, as on Ctrl-C
            t = ask(args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (ConfigError, FileNotFoundError, ValueError, VLLMUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(t, indent=1) if args.json else format_trajectory(t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
