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
