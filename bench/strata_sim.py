"""Learning-fidelity study: does Stratified GRPO change *what* a search agent learns?

A controlled simulation of the paper's structure (no LLM): a factored policy decides how many
searches to make (0, 1 or 2 = the stratum) and emits the "tokens" that decide each search's
quality and the reading of the evidence; the reward is 1 when the answer is right.

    0 searches: right w.p. P_PARAMETRIC (parametric knowledge only)            -> low mean
    1 search  : right w.p. P_ONE_HOP * read                                     -> medium
    2 searches: right w.p. P_TWO_HOP * query^2 * read, query skill starts weak -> highest ceiling,
                                                                                  rarely right at first
with read = sigmoid(theta_read), query = sigmoid(theta_query) learned by policy gradient on
the tokens they emit, and the search count drawn from softmax(phi). Every method uses the
project's own estimator (openrlhf_sgrpo.advantages segment helpers; alpha=0 is GRPO) and
the same REINFORCE update; seeds x methods x prompts x samples run as one tensor batch.

Methods: GRPO, Stratified GRPO at several alpha, and the paper's Table 7 control (strata drawn
at random). A second environment gives every stratum the same reward law: there SGRPO and
GRPO must learn the same thing. Prints a table (final reward, searches per question, ratio of
each method's final reward to GRPO's in the same run) and writes PNG plots.

    python bench/strata_sim.py [--steps 300 --seeds 8 --out docs/img]

A third environment, ``measured``, takes its laws from the LLM study's seeds (issue #56, item 4):
``--from-seeds docs/study/seeds --regime trap`` pools the strata the seeds measured after the
warm-up (``strata_warmup`` in seed.json: each search count's share and EM on held-out two-hop
questions) and starts the simulated policy there, with the demo task's structure: one search pays
at most ``--one-search-ceiling`` (the trap's shortcut: right for half of the people; 0 on the
search-necessary task), two searches pay ``read * bridge`` (one learned query, the second; the
first query of the demo's task is always the person), no search pays its measured EM. Methods
are the LLM study's arms (GRPO, SGRPO alpha 0.8, random strata alpha 0.8, SAN alone), so its
curves go beside the seeds' (docs/study.md).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from openrlhf_sgrpo.advantages import make_segments, normalized_advantages

NUM_STRATA = 3  # 0, 1, 2 searches
P_PARAMETRIC = 0.2
P_ONE_HOP = 0.6
P_TWO_HOP = 0.95
INIT_READ = 0.8  # sigmoid(theta_read) at start
INIT_QUERY = 0.25  # sigmoid(theta_query) at start: two-hop succeeds ~5% of the time
P_EQUAL = 0.5  # the equal-law environment: every stratum right w.p. P_EQUAL * read
EPS = 1e-6  # the estimator's default epsilon


@dataclass(frozen=True)
class Method:
    name: str
    alpha: float
    random_strata: bool = False


DEFAULT_METHODS = (Method("GRPO", 0.0), Method("SGRPO a=0.3", 0.3), Method("SGRPO a=0.6", 0.6),
                   Method("SGRPO a=1.0", 1.0), Method("random strata a=0.6", 0.6, True))


@dataclass(frozen=True)
class SimConfig:
    steps: int = 300
    seeds: int = 8
    prompts: int = 16
    samples: int = 8
    lr: float = 0.5
    env: str = "structured"  # or "equal", or "measured" (laws and start from the LLM's strata: Measured)
    measured: "Measured | None" = None


@dataclass(frozen=True)
class Measured:
    """The measured environment's laws and starting policy (from the study's seeds)."""

    shares: tuple[float, float, float]  # P(0, 1, 2 searches) at the start
    p_zero: float  # EM of answering without a search (fixed)
    one_ceiling: float  # the most one search can pay (the shortcut's share)
    init_read: float  # reading skill at the start: one search's EM / its ceiling
    init_bridge: float  # second-query skill at the start: two searches' EM / read


STUDY_METHODS = (Method("GRPO", 0.0), Method("SGRPO a=0.8", 0.8), Method("random strata a=0.8", 0.8, True),
                 Method("SAN a=1.0", 1.0))


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def simulate(cfg: SimConfig, methods=DEFAULT_METHODS, seed: int = 0, progress: bool = True) -> dict:
    """Train every (method, seed) policy; return per-step curves [M, S, steps] as tensors."""
    g = torch.Generator().manual_seed(seed)
    m, s, q, n = len(methods), cfg.seeds, cfg.prompts, cfg.samples
    meas = cfg.measured
    if (cfg.env == "measured") != (meas is not None):
        raise ValueError("env 'measured' needs SimConfig.measured, and only it takes one")
    start = torch.tensor(meas.shares).clamp_min(1e-3).log() if meas else torch.zeros(NUM_STRATA)
    phi = start.expand(m, s, NUM_STRATA).clone().requires_grad_(True)  # search-count logits (uniform by default)
    theta_read = torch.full((m, s), _logit(meas.init_read if meas else INIT_READ), requires_grad=True)
    theta_query = torch.full((m, s), _logit(meas.init_bridge if meas else INIT_QUERY), requires_grad=True)
    opt = torch.optim.SGD([phi, theta_read, theta_query], lr=cfg.lr)
    alpha = torch.tensor([mt.alpha for mt in methods]).view(m, 1, 1, 1)
    random_strata = torch.tensor([mt.random_strata for mt in methods]).view(m, 1, 1, 1)
    reward_curve = torch.zeros(m, s, cfg.steps)
    searches_curve = torch.zeros(m, s, cfg.steps)
    multi_curve = torch.zeros(m, s, cfg.steps)
    shape = (m, s, q, n)
    for step in tqdm(range(cfg.steps), desc=f"strata_sim[{cfg.env}]", disable=not progress):
        logp_k = torch.log_softmax(phi, -1)  # [m, s, 3]
        k = torch.multinomial(logp_k.detach().exp().reshape(-1, NUM_STRATA), q * n, replacement=True,
                              generator=g).view(shape)
        read_p = torch.sigmoid(theta_read)[..., None, None].expand(shape)
        query_p = torch.sigmoid(theta_query)[..., None, None].expand(shape)
        read_ok = torch.rand(shape, generator=g) < read_p.detach()
        q1 = torch.rand(shape, generator=g) < query_p.detach()
        q2 = torch.rand(shape, generator=g) < query_p.detach()
        env_u = torch.rand(shape, generator=g)
        if cfg.env == "measured":  # one learned query (the bridge), on two-search rollouts only
            reward = _measured_reward(meas, k, read_ok, q1, env_u)
            n_queries = (k == 2).long()
            q2 = torch.ones_like(q1)
        else:
            reward = _reward(cfg.env, k, read_ok, q1 & q2, env_u)
            n_queries = k.clamp_max(2) if cfg.env == "structured" else torch.zeros_like(k)
        # log-prob of every policy "token" the rollout emitted (queries only when it searched)
        logp = logp_k.gather(-1, k.view(m, s, -1)).view(shape)
        logp = logp + _bernoulli_logp(read_p, read_ok) * (k > 0 if cfg.env != "equal" else 1)
        logp = logp + _bernoulli_logp(query_p, q1) * (n_queries >= 1) + _bernoulli_logp(query_p, q2) * (n_queries >= 2)
        strata = torch.where(random_strata, torch.randint(0, NUM_STRATA, shape, generator=g), k)
        adv = _advantages(reward, strata, alpha, n)
        loss = -(adv * logp).mean(dim=(2, 3)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        reward_curve[..., step] = reward.float().mean(dim=(2, 3))
        searches_curve[..., step] = k.float().mean(dim=(2, 3))
        multi_curve[..., step] = (k == 2).float().mean(dim=(2, 3))
    return {"methods": [mt.name for mt in methods], "reward": reward_curve, "searches": searches_curve, "multi": multi_curve,
            "p_search": torch.softmax(phi.detach(), -1), "read": torch.sigmoid(theta_read.detach()),
            "query": torch.sigmoid(theta_query.detach())}


def _reward(env: str, k: torch.Tensor, read_ok: torch.Tensor, queries_ok: torch.Tensor, u: torch.Tensor
            ) -> torch.Tensor:
    if env == "equal":
        return ((u < P_EQUAL) & read_ok).float()
    if env != "structured":
        raise ValueError(f"env must be 'structured' or 'equal', got {env!r}")
    zero = u < P_PARAMETRIC
    one = (u < P_ONE_HOP) & read_ok
    two = (u < P_TWO_HOP) & read_ok & queries_ok
    return torch.where(k == 0, zero, torch.where(k == 1, one, two)).float()


def _measured_reward(meas: Measured, k: torch.Tensor, read_ok: torch.Tensor, bridge_ok: torch.Tensor,
                     u: torch.Tensor) -> torch.Tensor:
    zero = u < meas.p_zero
    one = (u < meas.one_ceiling) & read_ok
    two = read_ok & bridge_ok
    return torch.where(k == 0, zero, torch.where(k == 1, one, two)).float()


def measured_from_seeds(folder: Path, regime: str, one_ceiling: float) -> tuple[Measured, dict]:
    """Pool the strata the study's seeds of ``regime`` measured after the warm-up (counts, not
    means of shares: every sampled trajectory weighs the same) into the measured laws; also
    returns what was pooled (seeds, counts per stratum)."""
    counts = {k: [0, 0] for k in ("0", "1", "2")}  # stratum -> [trajectories, EM 1]
    seeds = []
    for meta_path in sorted(Path(folder).glob("*/seed.json")):
        import json

        meta = json.loads(meta_path.read_text())
        check = meta.get("strata_warmup")
        if meta.get("regime") != regime or not check:
            continue
        seeds.append(meta_path.parent.name)
        for key, v in check["strata"].items():
            slot = counts["2" if key in ("2", "3plus") else key]
            slot[0] += int(v["n"])
            slot[1] += round(v["em"] * v["n"])
    total = sum(n for n, _ in counts.values())
    if not seeds or total == 0:
        raise ValueError(f"no seed of regime {regime!r} with a strata check under {folder}")
    em = {k: (w / n if n else 0.0) for k, (n, w) in counts.items()}
    read = min(max(em["1"] / one_ceiling if one_ceiling > 0 else 0.9, 0.05), 0.99)
    bridge = min(max(em["2"] / read, 0.02), 0.99)
    shares = tuple(counts[k][0] / total for k in ("0", "1", "2"))
    return Measured(shares, em["0"], one_ceiling, read, bridge), {"seeds": seeds, "counts": counts}


def _bernoulli_logp(p: torch.Tensor, outcome: torch.Tensor) -> torch.Tensor:
    return torch.where(outcome, p.clamp_min(1e-6).log(), (1 - p).clamp_min(1e-6).log())


def _advantages(reward: torch.Tensor, strata: torch.Tensor, alpha: torch.Tensor, n: int) -> torch.Tensor:
    """alpha * A_SAN + (1 - alpha) * A_GN per method, from the project's segment helpers.

    Same math as ``stratified_advantages`` (population std, eps 1e-6; checked in the tests), but
    GN and SAN are computed once for all methods and seeds, and each method blends its own alpha.
    """
    flat_r = reward.reshape(-1)
    segs = make_segments(strata.reshape(-1), n)
    a_gn = normalized_advantages(flat_r, segs.group, segs.num_groups, EPS).view(reward.shape)
    a_san = normalized_advantages(flat_r, segs.cell, segs.num_cells, EPS).view(reward.shape)
    return alpha * a_san + (1 - alpha) * a_gn


def summarize(result: dict, last: int = 50) -> list[dict]:
    """Final reward / searches per question (mean over the last steps, then mean +- s.e. over seeds)."""
    rows = []
    r = result["reward"][..., -last:].mean(-1)
    k = result["searches"][..., -last:].mean(-1)
    base = r[0].mean()
    for i, name in enumerate(result["methods"]):
        s = r.shape[1]
        rows.append({"method": name, "reward": float(r[i].mean()), "reward_se": float(r[i].std() / math.sqrt(s)),
                     "searches": float(k[i].mean()), "searches_se": float(k[i].std() / math.sqrt(s)),
                     "p_two_search": float(result["p_search"][i, :, 2].mean()),
                     "query_skill": float(result["query"][i].mean()),
                     "reward_vs_grpo": float(r[i].mean() / base) if base > 0 else float("nan")})
    return rows


def format_table(rows: list[dict], title: str) -> str:
    lines = [f"### {title}", "",
             "| method | final reward | searches / question | P(2 searches) | query skill | reward / GRPO |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['reward']:.3f} ± {r['reward_se']:.3f} | "
                     f"{r['searches']:.2f} ± {r['searches_se']:.2f} | {r['p_two_search']:.2f} | "
                     f"{r['query_skill']:.2f} | {r['reward_vs_grpo']:.2f} |")
    return "\n".join(lines)


def plot(results: dict[str, dict], path: Path, smooth: int = 10) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # 880 px wide at dpi 100 (the width a README renders), text at 11 pt: legible there unscaled
    plt.rcParams.update({"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 10})
    fig, axes = plt.subplots(len(results), 2, figsize=(8.8, 2.9 * len(results) + 0.5), squeeze=False)
    kernel = torch.ones(1, 1, smooth) / smooth
    for row, (env, res) in enumerate(results.items()):
        for col, key in enumerate(("reward", "multi")):
            ax = axes[row, col]
            for i, name in enumerate(res["methods"]):
                curve = res[key][i].mean(0).view(1, 1, -1)
                smoothed = torch.nn.functional.conv1d(curve, kernel).view(-1)
                ax.plot(smoothed.numpy(), label=name)
            ax.set_title(f"{env} laws: {'reward' if key == 'reward' else 'share of 2-search rollouts'}")
            ax.set_xlabel("step")
    handles, labels = axes[0, 0].get_legend_handles_labels()  # one legend above the panels, not inside one
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), frameon=False, handlelength=1.5,
               columnspacing=1.2)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    ap.add_argument("--from-seeds", type=Path, default=None,
                    help="the measured environment only, its laws from these study seed folders' strata checks")
    ap.add_argument("--regime", choices=("trap", "search"), default="trap", help="which seeds --from-seeds pools")
    ap.add_argument("--one-search-ceiling", type=float, default=None,
                    help="most one search can pay in the measured environment (default: 0.5 for trap, the "
                         "shortcut's share; 0 for search)")
    args = ap.parse_args(argv)
    for name in ("steps", "seeds", "prompts"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.samples < 2:
        ap.error(f"--samples must be >= 2 (a group baseline needs a group), got {args.samples}")
    torch.set_num_threads(1)  # tiny tensors: extra threads only spin (measured 10x slower on 2 shared cores)
    t0 = time.perf_counter()
    results = {}
    if args.from_seeds is not None:
        ceiling = args.one_search_ceiling if args.one_search_ceiling is not None else (0.5 if args.regime == "trap"
                                                                                        else 0.0)
        try:
            meas, pooled = measured_from_seeds(args.from_seeds, args.regime, ceiling)
        except ValueError as err:
            ap.error(str(err))
        print(f"measured laws from {len(pooled['seeds'])} seed(s) of the {args.regime} regime, trajectories and EM-1 "
              f"counts per search count {pooled['counts']}: {meas}")
        cfg = SimConfig(args.steps, args.seeds, args.prompts, args.samples, args.lr, "measured", meas)
        results["measured"] = simulate(cfg, STUDY_METHODS)
        print(format_table(summarize(results["measured"], last=max(1, min(50, args.steps // 4))),
                           f"measured laws, {args.regime} ({args.seeds} seeds, {args.steps} steps, "
                           f"{args.prompts}x{args.samples} rollouts/step)"))
        png = args.out / f"strata_sim_measured_{args.regime}.png"
    else:
        for env in ("structured", "equal"):
            cfg = SimConfig(args.steps, args.seeds, args.prompts, args.samples, args.lr, env)
            results[env] = simulate(cfg)
            print(format_table(summarize(results[env]), f"{env} reward laws ({args.seeds} seeds, {args.steps} steps, "
                                                        f"{args.prompts}x{args.samples} rollouts/step)"))
            print()
        png = args.out / "strata_sim.png"
    plot(results, png)
    print(f"plot: {png}   wall time: {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
