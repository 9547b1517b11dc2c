"""Theorem monitors: the values on random batches, and their presence in every estimator's log."""

from __future__ import annotations

import pytest
import torch

from openrlhf_sgrpo.metrics import stratification_metrics

SEEDS = range(20)


def random_batch(seed: int, prompts: int = 7, n: int = 8):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.rand(prompts * n, generator=g, dtype=torch.float64) * 3 - 1
    rewards[: n] = rewards[: n].round()  # one prompt with ties and constant strata
    strata = torch.randint(0, 4, (prompts * n,), generator=g)
    return rewards, strata, n


@pytest.mark.parametrize("seed", SEEDS)
def test_theorem1_pair_matches_to_1e6(seed):
    rewards, strata, n = random_batch(seed)
    m = stratification_metrics(rewards, strata, n)
    assert m["sgrpo/var_reduction"] == pytest.approx(m["sgrpo/between_stratum_term"], abs=1e-6)
    assert m["sgrpo/var_reduction"] >= -1e-12  # and the reduction is never negative
    # the measured side really is Var[A_G] - Var[A_S], computed here independently per prompt
    r, s = rewards.view(-1, n), strata.view(-1, n)
    var_g = ((r - r.mean(1, keepdim=True)) ** 2).mean(1)
    var_s = torch.zeros_like(var_g)
    for p in range(r.shape[0]):
        for k in s[p].unique():
            sel = r[p][s[p] == k]
            var_s[p] += ((sel - sel.mean()) ** 2).sum() / n
    assert m["sgrpo/var_reduction"] == pytest.approx(float((var_g - var_s).mean()), abs=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
def test_theorem4_and_5_values(seed):
    rewards, strata, n = random_batch(seed)
    m = stratification_metrics(rewards, strata, n, eps=1e-12)
    assert m["sgrpo/in_stratum_var_san"] == pytest.approx(1.0, abs=1e-6)  # Theorem 4
    # Theorem 5: the group variance of SAN is the share of samples in non-constant strata
    r, s = rewards.view(-1, n), strata.view(-1, n)
    share = []
    for p in range(r.shape[0]):
        live = sum(int((s[p] == k).sum()) for k in s[p].unique() if r[p][s[p] == k].std(unbiased=False) > 1e-9)
        share.append(live / n)
    assert m["sgrpo/global_var_san"] == pytest.approx(sum(share) / len(share), abs=1e-6)
    assert m["sgrpo/global_var_san"] <= 1.0 + 1e-9


def _experiences(n=4, prompts=3, seed=0):
    from openrlhf.trainer.ppo_utils.experience import Experience

    g = torch.Generator().manual_seed(seed)
    total = n * prompts
    rewards = torch.randint(0, 2, (total,), generator=g).float()
    calls = torch.randint(0, 3, (total,), generator=g)
    out = []
    for i in reversed(range(total)):  # not in prompt order, as after OpenRLHF's shuffling
        mask = torch.ones(1, 5, dtype=torch.bool)
        out.append(Experience(sequences=torch.ones(1, 6, dtype=torch.long), action_mask=mask, kl=torch.zeros(1, 5),
                              rewards=rewards[i:i + 1].clone(), response_length=torch.tensor([5]),
                              truncated=torch.tensor([False]), index=[i],
                              info={"tool_calls": calls[i:i + 1].clone()}))
    return out, rewards, calls


@pytest.mark.parametrize("estimator", ["group_norm", "rloo", "dr_grpo", "reinforce_baseline", "stratified_grpo"])
def test_monitors_reach_every_estimators_log(openrlhf_gpu_stubs, estimator):
    from types import SimpleNamespace

    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    args = parse_config(["--algo.advantage.estimator", estimator, "--rollout.n_samples_per_prompt", "4"])
    maker = StratifiedExperienceMaker(None, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args),
                                      tokenizer=None)
    exps, rewards, calls = _experiences()
    out = maker.compute_advantages_and_returns(exps)
    want = stratification_metrics(rewards, calls, 4)
    for key in ("sgrpo/var_reduction", "sgrpo/between_stratum_term", "sgrpo/in_stratum_var_san",
                "sgrpo/global_var_san"):
        for e in out:  # per-sample constants: OpenRLHF's sample-weighted log mean is the batch value
            assert e.info[key].shape == (1,)
            assert float(e.info[key]) == pytest.approx(want[key], nan_ok=True)


def test_monitors_are_skipped_not_fatal_without_the_strata_key(openrlhf_gpu_stubs):
    from types import SimpleNamespace

    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    args = parse_config(["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4"])
    maker = StratifiedExperienceMaker(None, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args),
                                      tokenizer=None)
    exps, _, _ = _experiences()
    for e in exps:
        del e.info["tool_calls"]  # a plain (non-agent) GRPO run
    out = maker.compute_advantages_and_returns(exps)
    assert all(e.advantages is not None and not any(k.startswith("sgrpo/") for k in e.info) for e in out)
