"""Our command-line flags, added on top of OpenRLHF 0.11.2's own parser (unchanged)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from types import SimpleNamespace

from openrlhf_sgrpo.advantages import STD_KINDS, STRATIFIED_ESTIMATORS
from openrlhf_sgrpo.openrlhf_ext.config import DEFAULT_ALPHA, DEFAULT_EPS, DEFAULT_STD
from openrlhf_sgrpo.openrlhf_ext.torch_adam import DEFAULT_OPTIMIZER, OPTIMIZERS
from openrlhf_sgrpo.strata import DEFAULT_STRATIFY_BY, parse_strata_spec

ESTIMATOR_DEST = "algo.advantage.estimator"
ROLLOUT_ENGINES = ("vllm", "hf")

# Other extensions (SAPO, CalibAdv) register (add_flags, validate) pairs here.
FlagAdder = Callable[[argparse.ArgumentParser], None]
Validator = Callable[[SimpleNamespace], list[str]]
_EXTENSIONS: list[tuple[FlagAdder, Validator]] = []


def register_flags(add: FlagAdder, validate: Validator) -> None:
    if (add, validate) not in _EXTENSIONS:
        _EXTENSIONS.append((add, validate))


def add_sgrpo_flags(parser: argparse.ArgumentParser) -> None:
    """Add our flags and make the stratified estimators valid choices of OpenRLHF's flag."""
    for action in parser._actions:  # argparse has no public API to extend choices
        if action.dest == ESTIMATOR_DEST and action.choices is not None:
            action.choices = list(action.choices) + [e for e in STRATIFIED_ESTIMATORS if e not in action.choices]
            action.help = (action.help or "") + f"; openrlhf-sgrpo adds {', '.join(STRATIFIED_ESTIMATORS)}"
    g = parser.add_argument_group("openrlhf-sgrpo: Stratified GRPO")
    g.add_argument("--algo.advantage.sgrpo_alpha", type=float, default=DEFAULT_ALPHA,
                   help="blend weight of stratified normalization: A = alpha*A_SAN + (1-alpha)*A_GN "
                        "(paper: 0.6 base, 0.8 instruct; 0 = GRPO, 1 = SAN only)")
    g.add_argument("--algo.advantage.stratify_by", type=str, default=DEFAULT_STRATIFY_BY,
                   help="Experience.info key(s) defining strata, e.g. tool_calls or search_calls,code_calls; "
                        "or the paper's random-strata control: random:tool_calls (the tool-call strata's sizes, "
                        "members shuffled inside each prompt group) or random_k:K (K balanced random strata), "
                        "drawn from --train.seed and the step")
    g.add_argument("--algo.advantage.strata_cap", type=int, default=None,
                   help="merge strata with counts >= cap (None: no merging)")
    g.add_argument("--algo.advantage.sgrpo_eps", type=float, default=DEFAULT_EPS,
                   help="epsilon added to per-stratum and per-prompt stds")
    g.add_argument("--algo.advantage.sgrpo_std", type=str, default=DEFAULT_STD, choices=list(STD_KINDS),
                   help="population std (the paper) or unbiased (OpenRLHF's group_norm convention)")
    r = parser.add_argument_group("openrlhf-sgrpo: rollout records (python -m openrlhf_sgrpo.inspect RUN_DIR)")
    r.add_argument("--sgrpo.dump_rollouts", type=int, default=0,
                   help="write this many prompt groups per step (trajectories, strata, advantages) as jsonl "
                        "to RUN_DIR/rollouts/train/ (0: off)")
    r.add_argument("--sgrpo.run_dir", type=str, default=None,
                   help="RUN_DIR of the rollout records (default: --ckpt.output_dir)")
    e = parser.add_argument_group("openrlhf-sgrpo: rollout engine")
    e.add_argument("--sgrpo.rollout_engine", type=str, default="vllm", choices=list(ROLLOUT_ENGINES),
                   help="vllm: OpenRLHF's engines. hf: the project's batched transformers engine in their place "
                        "(much slower; for machines where vLLM does not install): needs --train.colocate_all, "
                        "--vllm.tensor_parallel_size 1 and --train.agent_func_path; weights reach it over CUDA IPC")
    o = parser.add_argument_group("openrlhf-sgrpo: optimizer")
    o.add_argument("--sgrpo.optimizer", type=str, default=DEFAULT_OPTIMIZER, choices=list(OPTIMIZERS),
                   help="the policy's AdamW: deepspeed = DeepSpeed's FusedAdam (CPUAdam with --ds.adam_offload), "
                        "JIT-compiled with nvcc on first use (upstream's default); torch_fused = torch.optim.AdamW "
                        "(fused=True) through DeepSpeed's torch_adam setting: the same update, nothing to compile")
    v = parser.add_argument_group("openrlhf-sgrpo: weight sync check")
    v.add_argument("--sgrpo.verify_weight_sync", type=int, default=0, metavar="N",
                   help="after a weight sync into vLLM, check by value that every engine holds the trainer's "
                        "weights (exact per-tensor digests computed on each side; only integers cross Ray) and "
                        "fail the run naming the tensors that differ. 0: off; N > 0: the first N syncs; "
                        "-1: every sync. Needs --vllm.tensor_parallel_size 1 (a TP worker holds shards)")
    g.add_argument("--dry_run", action="store_true", default=False,
                   help="print the parsed, hierarchized config as JSON and exit (no Ray, no GPU)")
    for add, _ in _EXTENSIONS:
        add(parser)


def validate_sgrpo_args(args: SimpleNamespace) -> list[str]:
    """Every problem with our options, each message naming the flag and the bad value."""
    adv = args.algo.advantage
    errors = []
    alpha = adv.sgrpo_alpha
    if not (math.isfinite(alpha) and 0.0 <= alpha <= 1.0):
        errors.append(f"--algo.advantage.sgrpo_alpha must be in [0, 1], got {alpha}")
    if not (math.isfinite(adv.sgrpo_eps) and adv.sgrpo_eps >= 0):
        errors.append(f"--algo.advantage.sgrpo_eps must be >= 0, got {adv.sgrpo_eps}")
    if args.sgrpo.dump_rollouts < 0:
        errors.append(f"--sgrpo.dump_rollouts must be >= 0, got {args.sgrpo.dump_rollouts}")
    if adv.strata_cap is not None and adv.strata_cap < 1:
        errors.append(f"--algo.advantage.strata_cap must be >= 1, got {adv.strata_cap}")
    try:
        parse_strata_spec(adv.stratify_by)
    except ValueError as exc:
        errors.append(f"--algo.advantage.stratify_by: {exc}")
    if adv.estimator in STRATIFIED_ESTIMATORS and args.rollout.n_samples_per_prompt < 2:
        errors.append(f"--algo.advantage.estimator {adv.estimator} needs --rollout.n_samples_per_prompt >= 2, "
                      f"got {args.rollout.n_samples_per_prompt}")
    errors.extend(_stratified_option_errors(args))
    errors.extend(_is_correction_errors(args))
    errors.extend(_rollout_engine_errors(args))
    if args.sgrpo.optimizer != DEFAULT_OPTIMIZER and args.actor.optim != "adam":
        errors.append(f"--sgrpo.optimizer {args.sgrpo.optimizer} picks the AdamW kernel; it does not apply to "
                      f"--actor.optim {args.actor.optim}")
    errors.extend(_verify_weight_sync_errors(args))
    for _, validate in _EXTENSIONS:
        errors.extend(validate(args))
    return errors


def _verify_weight_sync_errors(args: SimpleNamespace) -> list[str]:
    """``--sgrpo.verify_weight_sync`` compares whole tensors held by OpenRLHF's vLLM engines."""
    n = args.sgrpo.verify_weight_sync
    if n < -1:
        return [f"--sgrpo.verify_weight_sync must be 0 (off), N > 0 (the first N syncs) or -1 (every sync), got {n}"]
    if n == 0:
        return []
    errors = []
    if args.vllm.tensor_parallel_size > 1:
        errors.append(f"--sgrpo.verify_weight_sync {n} needs --vllm.tensor_parallel_size 1, got "
                      f"{args.vllm.tensor_parallel_size}: each tensor-parallel worker holds a shard of each "
                      f"weight, and the check compares whole tensors")
    if (args.vllm.num_engines or 0) < 1:
        errors.append(f"--sgrpo.verify_weight_sync {n} checks vLLM engines, and --vllm.num_engines is "
                      f"{args.vllm.num_engines}: there is no engine to check")
    if args.sgrpo.rollout_engine != "vllm":
        errors.append(f"--sgrpo.verify_weight_sync {n} checks vLLM engines; --sgrpo.rollout_engine "
                      f"{args.sgrpo.rollout_engine} has none")
    return errors


# Why --algo.advantage.no_std_norm cannot change these estimators (it only drops the std from
# stratified_reinforce's batch whitening, as it does for upstream's reinforce_baseline).
_NO_STD_NORM_REASON = {
    "stratified_grpo": "its GN and SAN terms divide by the prompt's and the stratum's std by definition "
                       "(--algo.advantage.sgrpo_std picks the convention)",
    "stratified_rloo": "leave-one-out advantages are never divided by a std",
}


def _stratified_option_errors(args: SimpleNamespace) -> list[str]:
    """OpenRLHF options a stratified estimator would silently ignore: refused, each message naming
    both flags and why (the README's table "OpenRLHF options with our estimators")."""
    adv = args.algo.advantage
    if adv.estimator not in STRATIFIED_ESTIMATORS:
        return []
    ours = f"--algo.advantage.estimator {adv.estimator}"
    errors = []
    if adv.gamma != 1.0:
        errors.append(f"--algo.advantage.gamma {adv.gamma} does not apply to {ours}: its advantage is one number "
                      f"per trajectory, given to every action token undiscounted (OpenRLHF resets gamma to 1 for its "
                      f"group estimators too); leave gamma at 1")
    if adv.lambd != 1.0:
        errors.append(f"--algo.advantage.lambd {adv.lambd} does not apply to {ours}: lambda is GAE's "
                      f"(--algo.advantage.estimator gae, with a critic)")
    if adv.no_std_norm and adv.estimator in _NO_STD_NORM_REASON:
        errors.append(f"--algo.advantage.no_std_norm has no effect on {ours}: {_NO_STD_NORM_REASON[adv.estimator]}; "
                      f"it only drops the std from stratified_reinforce's batch whitening")
    if args.reward.normalize_enable and args.train.agent_func_path:
        errors.append(f"--reward.normalize_enable does nothing with {ours} and --train.agent_func_path: it normalizes "
                      f"a reward model's scores, and here the agent gives the rewards (no reward model runs)")
    return errors


def _is_correction_errors(args: SimpleNamespace) -> list[str]:
    """The two rules OpenRLHF 0.11.2's ``PolicyLoss`` enforces only when every policy actor builds
    it, on a running cluster; refused here at parse time instead (checked against PolicyLoss itself
    in tests/test_cli.py)."""
    adv = args.algo.advantage
    level, mode, gating = adv.is_correction_level, adv.is_correction_mode, adv.is_correction_gating
    errors = []
    if mode == "clip" and (level == "seq" or gating != "ratio"):
        errors.append(f"--algo.advantage.is_correction_mode clip needs --algo.advantage.is_correction_level token "
                      f"and --algo.advantage.is_correction_gating ratio (got {level} and {gating}): only a per-token "
                      f"ratio is a weight that can be clamped; use mode mask")
    if gating != "ratio" and level != "off" and adv.is_correction_threshold[0] > 0:
        errors.append(f"--algo.advantage.is_correction_gating {gating} takes one upper bound, "
                      f"--algo.advantage.is_correction_threshold DELTA, not LOW HIGH "
                      f"({' '.join(map(str, adv.is_correction_threshold))}): a divergence has no lower band")
    return errors


def _rollout_engine_errors(args: SimpleNamespace) -> list[str]:
    """``--sgrpo.rollout_engine hf`` takes weights over CUDA IPC, which OpenRLHF uses only in a
    synchronous colocated run, and serves one agent per engine on one GPU."""
    if args.sgrpo.rollout_engine != "hf":
        return []
    needs = {"--train.colocate_all": args.train.colocate_all,
             "no --train.async_enable": not args.train.async_enable,
             "--vllm.num_engines >= 1": (args.vllm.num_engines or 0) >= 1,
             "--vllm.tensor_parallel_size 1": args.vllm.tensor_parallel_size == 1,
             "--train.agent_func_path": bool(args.train.agent_func_path),
             "--algo.advantage.is_correction_level off": args.algo.advantage.is_correction_level == "off"}
    missing = [flag for flag, ok in needs.items() if not ok]
    return [f"--sgrpo.rollout_engine hf needs {', '.join(missing)}"] if missing else []


# SAPO and CalibAdv flags live in their own module (imported last: it needs register_flags).
from openrlhf_sgrpo.cli.flags_extensions import add_extension_flags, validate_extension_args

register_flags(add_extension_flags, validate_extension_args)
