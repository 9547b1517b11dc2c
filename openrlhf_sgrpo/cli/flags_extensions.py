"""CLI flags of the two extra methods users compare with Stratified GRPO: SAPO and CalibAdv;
and ``--sgrpo.shared_fs``, which states the storage every node of a multi-node run mounts
(checked in :mod:`openrlhf_sgrpo.cli.multinode`).

Registered into :mod:`openrlhf_sgrpo.cli.flags` (``register_flags``); defaults come from the math
modules so the CLI, the Ray workers (which read ``args.algo.sapo`` / ``args.algo.calibadv`` with
the same defaults) and the single-machine runner agree.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

from openrlhf_sgrpo import calibadv, sapo

SAPO = "--algo.sapo."
CALIB = "--algo.calibadv."


def _optional_float(text: str) -> float | None:
    return None if text.strip().lower() in ("none", "") else float(text)


def _optional_int(text: str) -> int | None:
    return None if text.strip().lower() in ("none", "") else int(text)


def _bool(text: str) -> bool:
    """``true/false`` (also 1/0, yes/no, on/off), so a switch whose default is on can be turned off."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_extension_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("openrlhf-sgrpo: SAPO (conditional KL on drifting positive tokens)")
    g.add_argument(f"{SAPO}enable", action="store_true", default=False,
                   help="add coef * KL(pi_old || pi_theta) on tokens with advantage >= 0 and ratio <= threshold")
    g.add_argument(f"{SAPO}coef", type=float, default=sapo.DEFAULT_COEF, help="weight of the SAPO term")
    g.add_argument(f"{SAPO}ratio_threshold", type=float, default=sapo.DEFAULT_RATIO_THRESHOLD,
                   help="penalize positive tokens whose pi_theta/pi_old fell to <= this")
    g.add_argument(f"{SAPO}estimator", type=str, default=sapo.DEFAULT_ESTIMATOR, choices=list(sapo.SAPO_ESTIMATORS),
                   help="per-token KL estimator: k1 = -log r, k3 = r - 1 - log r")

    c = parser.add_argument_group("openrlhf-sgrpo: CalibAdv (calibrated advantages for search turns)")
    d = calibadv.CalibAdvConfig()
    c.add_argument(f"{CALIB}enable", action="store_true", default=False,
                   help="soften negative advantages of turns that found new silver docs; rebalance answers")
    c.add_argument(f"{CALIB}silver_f1", type=float, default=d.silver_f1,
                   help="F1 the group's best well-formatted rollout needs for its retrieved docs to be silver")
    c.add_argument(f"{CALIB}silver_from", type=str, default=d.silver_from, choices=list(calibadv.SILVER_SOURCES),
                   help="silver docs from the well-formatted rollouts at the group's best F1 (best, the authors) "
                        "or from every one with F1 >= silver_f1 (all_good)")
    c.add_argument(f"{CALIB}scored_rollouts", type=str, default=d.scored_rollouts,
                   choices=list(calibadv.SCORED_ROLLOUTS),
                   help="rollouts whose search turns are scored and softened: format_ok (the authors' format "
                        "check, agent key format_ok) or all")
    c.add_argument(f"{CALIB}think_similarity", type=_optional_float, default=d.think_similarity,
                   help="a search turn whose <think> is more than this word-edit similar to an earlier search "
                        "turn's scores 0 (None: off)")
    c.add_argument(f"{CALIB}shared_docs", type=_optional_int, default=d.shared_docs,
                   help="a search turn sharing at least this many documents with one earlier search turn "
                        "scores 0 (None: off)")
    c.add_argument(f"{CALIB}target_ratio", type=float, default=d.target_ratio,
                   help="sum|negative| / sum positive after per-group rebalancing (1 = equal mass)")
    c.add_argument(f"{CALIB}adjust", type=str, default=d.adjust, choices=list(calibadv.ADJUST_SIDES),
                   help="which side the rebalancing rescales")
    c.add_argument(f"{CALIB}rebalance", type=str, default=d.rebalance, choices=list(calibadv.REBALANCE_SCOPES),
                   help="tokens rebalanced per group: the answer segment, the whole response, or none")
    c.add_argument(f"{CALIB}only_apply_risky", action="store_true", default=d.only_apply_risky,
                   help="rebalance only groups whose sum|neg|/sum pos exceeds target_ratio")
    c.add_argument(f"{CALIB}softpenalty_first", type=_bool, nargs="?", const=True, default=d.softpenalty_first,
                   metavar="true|false",
                   help="apply the per-turn soft penalty before the rebalancing (default true, the authors' "
                        "order); false: rebalance first")
    c.add_argument(f"{CALIB}aggressive_threshold", type=_optional_float, default=d.aggressive_threshold,
                   help="turn score s_t >= this zeroes a negative turn instead of scaling it (None: off)")
    c.add_argument(f"{CALIB}positive_upper_limit", action="store_true", default=d.positive_upper_limit,
                   help="negative turns get A + (max group A - A) * s_t instead of A * (1 - s_t)")
    m = parser.add_argument_group("openrlhf-sgrpo: multi-node runs (docs/multinode.md)")
    m.add_argument("--sgrpo.shared_fs", type=str, action="append", default=None, metavar="DIR",
                   help="a folder every Ray node mounts at this same path (NFS, Lustre, ...); repeatable. With more "
                        "than one node, --ckpt.output_dir, --ckpt.path (when saving or resuming), --sgrpo.run_dir "
                        "and --logger.tensorboard_dir must lie under one, or the run is refused at launch")
    c.add_argument(f"{CALIB}reset2zero", action="store_true", default=d.reset2zero,
                   help="positive rollouts get 0 on a search turn every rollout of the group aced")


def validate_extension_args(args: SimpleNamespace) -> list[str]:
    """Every bad SAPO/CalibAdv value, each message naming the flag."""
    s = args.algo.sapo
    errors = sapo.config_errors(s.coef, s.ratio_threshold, s.estimator, prefix=SAPO)
    c = args.algo.calibadv
    errors += calibadv.config_errors(c, prefix=CALIB)
    for folder in getattr(args.sgrpo, "shared_fs", None) or []:
        if not folder.startswith("/"):
            errors.append(f"--sgrpo.shared_fs {folder!r} must be an absolute path (every node mounts it there)")
    if c.enable and args.rollout.n_samples_per_prompt < 2:
        errors.append(f"{CALIB}enable needs prompt groups: --rollout.n_samples_per_prompt >= 2, "
                      f"got {args.rollout.n_samples_per_prompt}")
    return errors


def sapo_inert_reason(args: SimpleNamespace) -> str | None:
    """Why ``--algo.sapo.enable`` can have no effect with these batch settings, or None.

    OpenRLHF computes the old log-probs with the actor right before the update; with one
    optimizer step per rollout (mini-batch = all samples, one epoch) the policy being updated is
    the one that sampled, every importance ratio is 1, and SAPO's term is exactly 0.
    """
    if not args.algo.sapo.enable:
        return None
    samples = args.rollout.batch_size * args.rollout.n_samples_per_prompt
    if args.train.batch_size >= samples and args.train.max_epochs <= 1:
        return (f"--algo.sapo.enable has no effect: --train.batch_size {args.train.batch_size} covers the whole "
                f"rollout ({samples} samples) in one optimizer step with --train.max_epochs "
                f"{args.train.max_epochs}, so every importance ratio is 1; use a smaller --train.batch_size "
                f"(e.g. {samples // 2}) or more epochs")
    return None
