"""Where a local training step spends its time, and how well tool calls overlap.

    .venv/bin/python bench/rollout_breakdown.py [--steps 2] [--model tiny-qwen2]

Runs real Stratified GRPO steps (HF engine, OpenRLHF's agent executor, the real retriever over
MiniLM-encoded wiki extracts, the real sandbox) and prints per step: generate / tools /
experience (advantages + old log-probs) / update seconds, plus
  * exposed / tool-sum: THE GOAL, <= 0.25. Tool time during which no generate call was in
                        flight, over the summed tool latency: the share of tool latency the
                        rollout did not hide behind generation and other tool calls;
  * wall / tool-sum  : rollout wall time over the summed tool latency, for context only (it
                        measures how fast generation is and how often the policy calls tools,
                        not the overlap);
and, as a baseline measured in the same run, the same trajectories rolled out one at a time
(no overlap possible): the speed-up of the concurrent rollout over it.
With the tiny Qwen2 a few supervised steps first teach the action format (see
openrlhf_sgrpo/local/warmup.py) so that it does call tools.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--model", default="tiny-qwen2")
    p.add_argument("--prompts-per-step", type=int, default=4)
    p.add_argument("--n-samples", type=int, default=4)
    p.add_argument("--max-tokens-per-turn", type=int, default=16)
    p.add_argument("--device", default="cpu", help="policy device (cpu, cuda, ...)")
    p.add_argument("--warmup", default="mixed", choices=("mixed", "search"),
                   help="tiny Qwen2's format warm-up: searches and answers (mixed), or searches only, "
                        "a tool-heavy policy like a search agent's (search)")
    args = p.parse_args()

    from agent_env.config import AgentConfig
    from openrlhf_sgrpo import assets
    from openrlhf_sgrpo.demo.corpus import write_corpus
    from openrlhf_sgrpo.demo.fanout import answerable_subquestions, load_extracts, split
    from openrlhf_sgrpo.eval.table import format_table
    from openrlhf_sgrpo.engine.hf import HFGenerationEngine
    from openrlhf_sgrpo.local.models import TINY_QWEN2, load_policy
    from openrlhf_sgrpo.local.rollout import AgentRollout
    from openrlhf_sgrpo.local.services import cached_index_for, local_services
    from openrlhf_sgrpo.local.trainer import LocalTrainer, TrainConfig
    from openrlhf_sgrpo.local.warmup import action_format_pairs, format_warmup

    extracts = load_extracts(assets.wiki_extracts_json())
    subs = answerable_subquestions(assets.fanoutqa_dev_json(), extracts)
    train = [s.as_question() for s in split(subs, 4)[0][:32]]
    corpus = write_corpus(extracts, {s.evidence_title for s in subs[:40]}, 40)
    index = cached_index_for(corpus, progress=False)
    model, tok = load_policy(args.model, args.device)
    if args.model == TINY_QWEN2:
        pairs = action_format_pairs(train)
        if args.warmup == "search":
            pairs = [(q, a) for q, a in pairs if "<search>" in a]
        format_warmup(model, tok, train, pairs=pairs)
    rows = []
    with local_services(index) as urls, tempfile.TemporaryDirectory() as tmp:
        cfg = AgentConfig(retriever_url=urls.retriever_url, sandbox_url=urls.sandbox_url,
                          template="none" if args.model == TINY_QWEN2 else "search_r1_chat",
                          max_turns=3, max_obs_tokens=64, reward="f1")
        rollout = AgentRollout(HFGenerationEngine(model, tok, max_batch=64), tok, cfg, max_len=320,
                               max_tokens_per_turn=args.max_tokens_per_turn)
        tcfg = TrainConfig(steps=args.steps, prompts_per_step=args.prompts_per_step, n_samples=args.n_samples,
                           micro_batch_size=4, lr=1e-4)
        trainer = LocalTrainer(model, tok, rollout, train, tcfg, tmp)
        try:
            for r in trainer.train(progress=False):
                rows.append([r["step"], r["time/generate_busy_s"], r["time/tool_latency_sum_s"],
                             r["time/experience_s"], r["time/update_s"], int(r["time/tool_calls"]),
                             r["time/wall_over_tool_sum"] if r["time/tool_calls"] else float("nan"),
                             r["time/tool_exposed_over_sum"]])
            # Baseline in the same run: the same kind of rollout, one trajectory at a time.
            qs = train[: args.prompts_per_step]
            t = time.monotonic()
            conc = rollout.run([q.question for q in qs], [q.golds for q in qs], n=args.n_samples, progress=False)
            conc_wall = time.monotonic() - t
            t = time.monotonic()
            for q in qs:
                for _ in range(args.n_samples):
                    rollout.run([q.question], [q.golds], n=1, progress=False)
            seq_wall = time.monotonic() - t
        finally:
            rollout.close()
    print(format_table(["step", "generate s", "tools (sum) s", "experience s", "update s", "tool calls",
                        "wall/tool-sum", "exposed/tool-sum"], rows))
    print(f"\nconcurrent rollout {conc_wall:.2f} s vs one-at-a-time baseline {seq_wall:.2f} s: "
          f"speed-up x{seq_wall / conc_wall:.2f}; exposed tool share of this rollout "
          f"{conc.timing['time/tool_exposed_over_sum']:.3f} (goal <= 0.25)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
