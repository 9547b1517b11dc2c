"""Rollout-record overhead: dumping N prompt groups per step vs the experience maker's own work.

The cluster's opt-in dump (``records_from_experiences`` + ``RolloutWriter.write_step``) runs in
the same process, on the same step, right after ``compute_advantages_and_returns``. So the
baseline, measured in the same run, is that call itself: our ``StratifiedExperienceMaker`` on
512 prompts x 8 samples of agent-shaped experiences (real Qwen2 token ids decoded by the real
tokenizer: an ~220-token prompt, 0-3 search turns of 60 action + 150 observation tokens, a
30-token answer; every ``Experience.info`` key the agent emits). The dump decodes and writes
only the N recorded groups, so its cost grows with N, not with the batch. Generation and the
policy update, which dwarf both, are not in the baseline.

    .venv/bin/python bench/rollout_records_overhead.py [--prompts 512] [--n 8] [--groups 1 4 16 64]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agent_env import info_keys as K  # noqa: E402
from agent_env import metadata as M  # noqa: E402
from openrlhf_sgrpo.testing import install_gpu_import_stubs  # noqa: E402

MAX_TURNS, TOPK = 4, 3
PROMPT, ACTION, OBS, ANSWER = 220, 60, 150, 30


def interleaved(fns: list, repeats: int) -> list[float]:
    """Median time of each function, run in turn ``repeats`` times, so machine drift hits all
    alike (this machine is shared)."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, acc in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def trajectory(g: torch.Generator, words: torch.Tensor, searches: int) -> tuple[list[int], dict]:
    """Token ids and the agent's info row for one trajectory with ``searches`` search turns."""
    ids = words[torch.randint(0, len(words), (PROMPT,), generator=g)].tolist()
    ranges = []
    for _ in range(searches):
        ranges.append((len(ids), len(ids) + ACTION))
        ids += words[torch.randint(0, len(words), (ACTION + OBS,), generator=g)].tolist()
    ranges.append((len(ids), len(ids) + ANSWER))
    ids += words[torch.randint(0, len(words), (ANSWER,), generator=g)].tolist()
    meta = M.empty_metadata(MAX_TURNS, TOPK)
    meta.update({K.TOOL_CALLS: searches, K.SEARCH_CALLS: searches, K.TURNS: searches + 1, K.ANSWERED: 1})
    for k in range(searches):
        meta[K.turn_kind_key(k)] = K.KIND_SEARCH
        for j in range(TOPK):
            meta[K.turn_doc_key(k, j)] = int(torch.randint(0, 10**6, (1,), generator=g))
    meta[K.turn_kind_key(searches)] = K.KIND_ANSWER
    return ids, M.fill_action_ranges(meta, ranges, MAX_TURNS)


def make_batches(tok, prompts: int, n: int, micro: int, seed: int = 0) -> list:
    """Right-padded OpenRLHF experiences, shuffled into micro-batches with ``index`` (as
    ``split_rollout_samples`` leaves them), each row an agent trajectory."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    g = torch.Generator().manual_seed(seed)
    words = torch.arange(1000, 30000)  # ordinary BPE pieces of the Qwen2 vocabulary
    total = prompts * n
    order = torch.randperm(total, generator=g).tolist()
    batches = []
    for k in range(0, total, micro):
        rows = order[k:k + micro]
        trajs = [trajectory(g, words, int(torch.randint(0, 4, (1,), generator=g))) for _ in rows]
        width = max(len(ids) for ids, _ in trajs)
        seqs = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
        attn = torch.zeros(len(rows), width, dtype=torch.long)
        act = torch.zeros(len(rows), width - 1, dtype=torch.bool)
        for i, (ids, meta) in enumerate(trajs):
            seqs[i, :len(ids)], attn[i, :len(ids)] = torch.tensor(ids), 1
            for t in M.decode_turns(meta):
                act[i, t.start - 1:t.end - 1] = True
        info = {key: torch.tensor([float(m[key]) for _, m in trajs]) for key in trajs[0][1]}
        batches.append(Experience(
            sequences=seqs, attention_mask=attn, action_mask=act, kl=torch.zeros(act.shape),
            rewards=torch.randint(0, 2, (len(rows),), generator=g).float(),
            response_length=act.sum(-1), truncated=torch.zeros(len(rows), dtype=torch.bool),
            index=rows, prompts=[f"question {r // n}" for r in rows], labels=['["answer"]'] * len(rows), info=info))
    return batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    install_gpu_import_stubs()
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from openrlhf_sgrpo import assets
    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config
    from openrlhf_sgrpo.openrlhf_ext.config import sgrpo_options
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import ADVANTAGE_INFO_KEY, StratifiedExperienceMaker
    from openrlhf_sgrpo.rollout_records.sources import records_from_experiences
    from openrlhf_sgrpo.rollout_records.store import RolloutWriter

    tok = assets.load_qwen2_tokenizer()
    args = parse_config(["--algo.advantage.estimator", "stratified_grpo", "--rollout.n_samples_per_prompt", str(a.n)])
    maker = StratifiedExperienceMaker(None, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args),
                                      tokenizer=None)
    batches = make_batches(tok, a.prompts, a.n, a.micro)
    done = maker.compute_advantages_and_returns(copy.deepcopy(batches))
    opts = sgrpo_options(args)
    tokens = sum(int(b.attention_mask.sum()) for b in batches)
    with tempfile.TemporaryDirectory() as tmp:
        writer = RolloutWriter(tmp)
        sizes = {}

        def dump(groups: int):
            def run():
                path = writer.write_step("train", groups, records_from_experiences(
                    done, tok, a.n, step=1, adv_cfg=opts, max_groups=groups, advantage_key=ADVANTAGE_INFO_KEY))
                sizes[groups] = path.stat().st_size
            return run

        # One fresh copy per call, timed apart: the maker mutates its input.
        copies = [copy.deepcopy(batches) for _ in range(a.repeats + 1)]
        fns = [lambda: maker.compute_advantages_and_returns(copies.pop())] + [dump(g) for g in a.groups]
        times = interleaved(fns, a.repeats)
        t_adv = times[0]
        print(f"batch: {a.prompts} prompts x {a.n} samples, {tokens / (a.prompts * a.n):.0f} tokens per trajectory, "
              f"{len(batches)} experiences (1 thread, median of {a.repeats})")
        print(f"baseline: StratifiedExperienceMaker.compute_advantages_and_returns {t_adv * 1e3:.0f} ms")
        print(f"{'dumped groups':<16}{'dump':>12}{'ratio':>9}{'file':>10}")
        for groups, t in zip(a.groups, times[1:]):
            print(f"{groups:<16}{t * 1e3:>10.1f}ms{t / t_adv:>8.3f}x{sizes[groups] / 1024:>8.0f}KiB")


if __name__ == "__main__":
    main()
