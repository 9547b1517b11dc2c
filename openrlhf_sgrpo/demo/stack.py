"""What a demo run stands on: the retriever(s) and sandbox on loopback, the generation engine, the
agent rollouts that sample from it, and the greedy held-out evaluation by hop. Shared with
``bench/agent_eval_engines.py``, which measures the demo's evaluation on both engines."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

def make_engine(args, model, tok):
    """The generation engine the rollouts sample from: vLLM (from a saved copy of the policy, then
    synced to ``model``'s weights) or the HF fallback, which samples from ``model`` itself."""
    from openrlhf_sgrpo.engine import build_engine
    from openrlhf_sgrpo.local.models import policy_folder

    max_batch = max(args.concurrency, args.prompts_per_step * args.n_samples)
    if args.engine == "hf":
        return build_engine("hf", model, tok, seed=args.seed, max_batch=max_batch)
    share = args.gpu_memory_share  # the study's parallel runs each take a share (demo/study_runner.py)
    # on a CPU vLLM reads the utilization as a share of host memory; the KV cache is sized in bytes there
    extra = {"gpu_memory_utilization": share} if share is not None and args.device != "cpu" else {}
    return build_engine("vllm", model, tok, model_path=policy_folder(args.model), seed=args.seed,
                        max_batch=max_batch, max_model_len=args.max_len,
                        kv_cache_memory_bytes=int(args.kv_cache_gb * (1 << 30)), enforce_eager=True, **extra)


def sandbox_needed(no_sandbox: bool, template: str) -> tuple[bool, str]:
    """(start the sandbox?, why not): only when the template offers ``<code>`` and no flag said no."""
    from agent_env.config import AgentConfig

    if no_sandbox:
        return False, "--no-sandbox"
    if "code" not in AgentConfig(template=template).allowed_actions:
        return False, f"template {template} offers no <code>"
    return True, ""


@contextlib.contextmanager
def services(args, index: Path, train_index: Path | None, template: str):
    """Retriever(s) and, when the prompts offer ``<code>``, the sandbox on loopback; yields the agent
    configs of evaluation and training.

    The sandbox starts only for a template that offers code (``search_r1_chat``, the demo's, offers
    search alone): a laptop or a login node without root often cannot give the local backend its
    isolation, and a run whose prompts never ask for code must not fail on it.
    Training searches its own index where the task has one (the training pairs' passages), so no
    held-out passage reaches the policy while it learns; evaluation searches everything."""
    from agent_env.config import AgentConfig
    from openrlhf_sgrpo.local.services import local_services

    with contextlib.ExitStack() as stack:
        start, why_not = sandbox_needed(args.no_sandbox, template)
        urls = stack.enter_context(local_services(index, sandbox=start))
        print(f"retriever {urls.retriever_url}\nsandbox   {urls.sandbox_url or f'not started ({why_not})'}")
        cfg = AgentConfig(retriever_url=urls.retriever_url, sandbox_url=urls.sandbox_url, template=template,
                          max_turns=args.max_turns, topk=3, max_obs_tokens=args.max_obs_tokens, reward=args.reward,
                          format_reward=True)
        train_cfg = cfg
        if train_index is not None:
            train_url = stack.enter_context(local_services(train_index, sandbox=False)).retriever_url
            print(f"retriever for training (train pairs' passages only) {train_url}")
            train_cfg = dataclasses.replace(cfg, retriever_url=train_url)
        yield cfg, train_cfg


def make_rollout(args, engine, tok, agent_cfg, script=None):
    """The agent's rollout over ``engine`` with the demo's turn and length budgets; ``script``
    scripts first turns (``--smoke``'s training rollout), evaluation passes none."""
    from openrlhf_sgrpo.local.rollout import AgentRollout

    return AgentRollout(engine, tok, agent_cfg, args.max_len, args.max_tokens_per_turn,
                        temperature=args.temperature, first_turn_script=script)


def evaluate_heldout(args, rollout, name: str, held, predictions: Path, run_dir: Path, phase: str, step: int) -> dict:
    """Greedy held-out evaluation (resumable) summarized by hop."""
    from openrlhf_sgrpo.demo.hops import eval_by_hop
    from openrlhf_sgrpo.eval.core import TrajectoryRecords, evaluate

    return eval_by_hop(evaluate(rollout, name, held, predictions, args.concurrency,
                                records=TrajectoryRecords(run_dir, phase, step)))


def recorded_summary(predictions: Path, name: str, held) -> dict | None:
    """A finished evaluation's summary from its predictions (None when incomplete)."""
    from openrlhf_sgrpo.demo.hops import eval_by_hop
    from openrlhf_sgrpo.eval.core import read_records

    ids = {q.qid for q in held}
    rows = [r for r in read_records(predictions) if r.get("dataset") == name and r["id"] in ids]
    return eval_by_hop(rows) if len(rows) == len(ids) else None
