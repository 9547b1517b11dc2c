"""`python -m openrlhf_sgrpo.cli.train_ppo_ray`: OpenRLHF's real parser plus our flags."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from openrlhf_sgrpo.cli.train_ppo_ray import CliError, main, parse_config

# A full GRPO-style command line (Search-R1 setting) with every new flag.
GRPO_ARGV = [
    "--actor.model_name_or_path", "Qwen/Qwen2.5-3B", "--train.agent_func_path", "agent_env/openrlhf_agent.py",
    "--rollout.n_samples_per_prompt", "8", "--rollout.batch_size", "256", "--train.batch_size", "256",
    "--actor.adam.lr", "1e-6", "--algo.kl.init_coef", "0.001", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
    "--algo.advantage.estimator", "stratified_grpo", "--algo.advantage.sgrpo_alpha", "0.8",
    "--algo.advantage.stratify_by", "search_calls,code_calls", "--algo.advantage.strata_cap", "3",
    "--algo.advantage.sgrpo_eps", "1e-5", "--algo.advantage.sgrpo_std", "unbiased",
]


def test_dry_run_prints_hierarchized_config_as_json():
    proc = subprocess.run([sys.executable, "-m", "openrlhf_sgrpo.cli.train_ppo_ray", *GRPO_ARGV, "--dry_run"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads(proc.stdout)
    adv = cfg["algo"]["advantage"]
    assert adv["estimator"] == "stratified_grpo" and adv["sgrpo_alpha"] == 0.8
    assert adv["stratify_by"] == "search_calls,code_calls" and adv["strata_cap"] == 3
    assert adv["sgrpo_eps"] == 1e-5 and adv["sgrpo_std"] == "unbiased"
    # OpenRLHF's own parsing and post-processing ran: agent path sets remote_url, no critic for GRPO
    assert cfg["rollout"]["n_samples_per_prompt"] == 8 and cfg["actor"]["adam"]["lr"] == 1e-6
    assert cfg["reward"]["remote_url"] == ["agent"] and cfg["critic"]["model_name_or_path"] is None
    assert cfg["algo"]["kl"]["use_loss"] is True and cfg["dry_run"] is True


def test_defaults_are_the_papers():
    adv = parse_config(["--algo.advantage.estimator", "stratified_grpo", "--rollout.n_samples_per_prompt", "8"]
                       ).algo.advantage
    assert (adv.sgrpo_alpha, adv.stratify_by, adv.strata_cap, adv.sgrpo_std) == (0.6, "tool_calls", None,
                                                                                    "population")


@pytest.mark.parametrize("argv, message", [
    (["--algo.advantage.sgrpo_alpha", "1.5"], "sgrpo_alpha must be in [0, 1], got 1.5"),
    (["--algo.advantage.sgrpo_alpha", "nan"], "sgrpo_alpha must be in [0, 1], got nan"),
    (["--algo.advantage.sgrpo_eps", "-1"], "sgrpo_eps must be >= 0, got -1.0"),
    (["--algo.advantage.strata_cap", "0"], "strata_cap must be >= 1, got 0"),
    (["--algo.advantage.stratify_by", ","], "stratify_by"),
    (["--rollout.n_samples_per_prompt", "1"], "needs --rollout.n_samples_per_prompt >= 2, got 1"),
])
def test_bad_values_are_named(argv, message):
    with pytest.raises(CliError) as exc:
        parse_config(["--algo.advantage.estimator", "stratified_grpo", "--rollout.n_samples_per_prompt", "4", *argv])
    assert message in str(exc.value)


def test_cli_exit_codes_and_messages():
    bad = subprocess.run([sys.executable, "-m", "openrlhf_sgrpo.cli.train_ppo_ray", "--algo.advantage.estimator",
                          "stratified_rloo", "--rollout.n_samples_per_prompt", "1", "--dry_run"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "error: --algo.advantage.estimator stratified_rloo needs" in bad.stderr
    unknown = subprocess.run([sys.executable, "-m", "openrlhf_sgrpo.cli.train_ppo_ray", "--algo.advantage.estimator",
                              "stratified_ppo", "--dry_run"], capture_output=True, text=True, timeout=300)
    assert unknown.returncode == 2 and "invalid choice: 'stratified_ppo'" in unknown.stderr


def test_upstream_estimators_still_parse():
    assert parse_config(["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4"]
                        ).algo.advantage.estimator == "group_norm"


def test_sapo_without_a_second_update_is_called_inert(capsys):
    """One optimizer step per rollout: every ratio is 1 and SAPO's term is exactly 0; say so."""
    base = ["--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "8", "--algo.sapo.enable", "--dry_run",
            "--algo.advantage.estimator", "group_norm"]
    assert main([*base, "--train.batch_size", "32"]) == 0
    assert "warning: --algo.sapo.enable has no effect" in capsys.readouterr().err
    for fix in (["--train.batch_size", "16"], ["--train.batch_size", "32", "--train.max_epochs", "2"]):
        assert main([*base, *fix]) == 0
        assert "warning" not in capsys.readouterr().err


# ------------------------------------------------------- OpenRLHF's options with our estimators
# (docs/openrlhf_options.md's table "OpenRLHF options with our estimators"; the combinations that work are run
# on the real-Ray path in tests/test_cluster_options.py)

AGENT = ["--train.agent_func_path", "agent_env/openrlhf_agent.py"]


@pytest.mark.parametrize("estimator", ["stratified_grpo", "stratified_rloo", "stratified_reinforce"])
@pytest.mark.parametrize("argv, flag, why", [
    (["--algo.advantage.gamma", "0.99"], "--algo.advantage.gamma 0.99", "undiscounted"),
    (["--algo.advantage.lambd", "0.95"], "--algo.advantage.lambd 0.95", "lambda is GAE's"),
    (["--reward.normalize_enable", *AGENT], "--reward.normalize_enable", "the agent gives the rewards"),
])
def test_options_a_stratified_estimator_would_ignore_are_refused(estimator, argv, flag, why):
    """Refused at parse time, the message naming both flags and why, for every stratified estimator."""
    with pytest.raises(CliError) as exc:
        parse_config(["--algo.advantage.estimator", estimator, "--rollout.n_samples_per_prompt", "4", *argv])
    message = str(exc.value)
    assert flag in message and f"--algo.advantage.estimator {estimator}" in message and why in message


@pytest.mark.parametrize("estimator, why", [
    ("stratified_grpo", "divide by the prompt's and the stratum's std by definition"),
    ("stratified_rloo", "never divided by a std"),
])
def test_no_std_norm_is_refused_where_it_changes_nothing(estimator, why):
    with pytest.raises(CliError) as exc:
        parse_config(["--algo.advantage.estimator", estimator, "--rollout.n_samples_per_prompt", "4",
                      "--algo.advantage.no_std_norm"])
    assert f"--algo.advantage.no_std_norm has no effect on --algo.advantage.estimator {estimator}" in str(exc.value)
    assert why in str(exc.value)
    # stratified_reinforce whitens like reinforce_baseline: there it drops the std
    assert parse_config(["--algo.advantage.estimator", "stratified_reinforce", "--rollout.n_samples_per_prompt", "4",
                         "--algo.advantage.no_std_norm"]).algo.advantage.no_std_norm


def test_refusals_leave_upstream_estimators_alone():
    """gamma, lambd, no_std_norm and reward normalization keep OpenRLHF's meaning for its own estimators."""
    args = parse_config(["--algo.advantage.estimator", "reinforce", "--algo.advantage.gamma", "0.99",
                         "--algo.advantage.lambd", "0.95", "--algo.advantage.no_std_norm", "--reward.normalize_enable",
                         *AGENT])
    assert args.algo.advantage.gamma == 0.99 and args.reward.normalize_enable


def test_the_options_that_work_parse_together():
    """Every OpenRLHF option the table marks as working, with a stratified estimator, SAPO and CalibAdv."""
    args = parse_config([
        *AGENT, "--algo.advantage.estimator", "stratified_rloo", "--rollout.n_samples_per_prompt", "8",
        "--rollout.batch_size", "16", "--train.batch_size", "64", "--algo.sapo.enable", "--algo.calibadv.enable",
        "--train.async_enable", "--train.async_queue_size", "2", "--train.partial_rollout_enable",
        "--rollout.vllm_generate_batch_size", "32", "--algo.dynamic_filtering_enable",
        "--algo.dynamic_filtering_range", "0.0", "1.0", "--vllm.num_engines", "1",
        "--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_gating", "binary_kl",
        "--algo.advantage.is_correction_threshold", "0.05", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
        "--algo.kl.init_coef", "0.001", "--train.dynamic_batch_enable", "--rollout.max_tokens_per_gpu", "8192",
        "--reward.overlong_buffer_len", "64", "--reward.clip_range", "-5", "5", "--ds.packing_samples",
    ])
    assert args.train.partial_rollout_enable and args.algo.dynamic_filtering_enable
    assert args.algo.advantage.is_correction_threshold == [0.0, 0.05]


def _policy_loss_refuses(level: str, mode: str, gating: str, threshold: list[float]) -> bool:
    from openrlhf.models import PolicyLoss

    try:
        PolicyLoss(is_correction_level=level, is_correction_mode=mode, is_correction_gating=gating,
                   is_correction_threshold=threshold)
    except ValueError:
        return True
    return False


def test_is_correction_combinations_are_refused_exactly_where_policy_loss_would_refuse(openrlhf_gpu_stubs):
    """OpenRLHF builds PolicyLoss inside every policy actor, after the cluster is up; the CLI now
    refuses the same combinations at parse time. Checked against PolicyLoss itself, every combination."""
    import itertools

    refused = 0
    for level, mode, gating, threshold in itertools.product(["off", "token", "seq"], ["mask", "clip"],
                                                            ["ratio", "binary_kl", "tv"], [["0.5", "5.0"], ["0.1"]]):
        argv = ["--algo.advantage.estimator", "stratified_grpo", "--rollout.n_samples_per_prompt", "4",
                "--algo.advantage.is_correction_level", level, "--algo.advantage.is_correction_mode", mode,
                "--algo.advantage.is_correction_gating", gating, "--algo.advantage.is_correction_threshold",
                *threshold]
        as_parsed = [0.0, float(threshold[0])] if len(threshold) == 1 else [float(t) for t in threshold]
        try:
            assert parse_config(argv).algo.advantage.is_correction_threshold == as_parsed
            ours = False
        except CliError as exc:
            ours = True
            assert "--algo.advantage.is_correction_" in str(exc)
        assert ours == _policy_loss_refuses(level, mode, gating, as_parsed), (level, mode, gating, threshold)
        refused += ours
    assert 0 < refused < 36
