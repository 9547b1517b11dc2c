"""The random-strata control (the paper's Table 7): random:KEYS and random_k:K as a stratify_by.

Its advantages must be the estimator's on the drawn labels, the labels must keep every group's
tool-call strata sizes (random:tool_calls) and really move samples, draws come from the seeded
generator only, and every entry point (strata.py, the local runner's config, the demo flag, the
cluster CLI) refuses a bad spec by name.
"""

from __future__ import annotations

import copy

import pytest
import torch

from openrlhf_sgrpo.advantages import stratified_advantages
from openrlhf_sgrpo.strata import (
    batch_strata,
    parse_strata_spec,
    parse_stratify_by,
    random_k_strata,
    shuffle_within_groups,
    strata_generator,
)

N = 8


def _batch(seed: int, groups: int = 200, n: int = N):
    g = torch.Generator().manual_seed(seed)
    calls = torch.randint(0, 4, (groups * n,), generator=g)
    rewards = torch.rand(groups * n, generator=g) + 0.3 * calls  # structure carries reward
    return rewards, calls


def test_spec_forms():
    assert parse_strata_spec("tool_calls").keys == ("tool_calls",)
    assert not parse_strata_spec("search_calls,code_calls").is_random
    shuffled = parse_strata_spec("random:tool_calls")
    assert shuffled.keys == ("tool_calls",) and shuffled.shuffle and shuffled.is_random
    assert parse_strata_spec("random:search_calls,code_calls").keys == ("search_calls", "code_calls")
    k3 = parse_strata_spec("random_k:3")
    assert k3.random_k == 3 and k3.keys == () and k3.structural_keys == ("tool_calls",)


@pytest.mark.parametrize("spec", ["random:", "random_k:0", "random_k:x", "random_k:", "shuffle:tool_calls",
                                  "random:tool_calls:x", "random:,", ""])
def test_bad_spec_is_named(spec):
    with pytest.raises(ValueError) as exc:
        parse_strata_spec(spec)
    assert repr(spec) in str(exc.value)


def test_structural_only_callers_refuse_a_random_spec():
    # strata_from_info / parse_stratify_by would silently give the structural strata
    with pytest.raises(ValueError, match="'random:tool_calls' is a random-strata spec"):
        parse_stratify_by("random:tool_calls")


def test_random_spec_without_generator_is_refused():
    _, calls = _batch(0, groups=2)
    with pytest.raises(ValueError, match="needs a seeded torch.Generator"):
        batch_strata({"tool_calls": calls}, "random:tool_calls", calls.numel(), N)


@pytest.mark.parametrize("seed", range(5))
def test_shuffle_keeps_each_groups_tool_call_strata_sizes(seed):
    _, calls = _batch(seed)
    labels = batch_strata({"tool_calls": calls}, "random:tool_calls", calls.numel(), N,
                          generator=strata_generator(seed, 1))
    assert labels.dtype == torch.int64
    for got, want in zip(labels.view(-1, N), calls.view(-1, N)):
        assert torch.equal(torch.bincount(got, minlength=4), torch.bincount(want, minlength=4))


def test_shuffle_differs_from_identity_over_many_groups():
    _, calls = _batch(3)
    labels = batch_strata({"tool_calls": calls}, "random:tool_calls", calls.numel(), N,
                          generator=strata_generator(0, 1))
    mixed = [(c != c[0]).any() for c in calls.view(-1, N)]  # groups a shuffle can change at all
    moved = [bool((lab != c).any()) for lab, c, m in zip(labels.view(-1, N), calls.view(-1, N), mixed) if m]
    assert len(moved) > 150 and sum(moved) / len(moved) > 0.9


@pytest.mark.parametrize("seed", range(5))
def test_advantages_are_the_estimators_on_the_shuffled_labels(seed):
    """The local runner's advantages with random:tool_calls equal stratified_advantages called on
    the labels drawn with the same generator, exactly."""
    from openrlhf_sgrpo.local.experience import Sample
    from openrlhf_sgrpo.local.experience_maker import AdvantageConfig, sample_advantages

    rewards, calls = _batch(seed, groups=6)
    samples = [Sample(torch.ones(3, dtype=torch.long), torch.ones(3), torch.ones(2), None, float(r), float(r), 2, 3,
                      False, False, {"tool_calls": int(c)}) for r, c in zip(rewards, calls)]
    cfg = AdvantageConfig(estimator="stratified_grpo", alpha=0.6, stratify_by="random:tool_calls")
    result = sample_advantages(samples, N, cfg, generator=strata_generator(seed, 7))
    labels = shuffle_within_groups(calls, N, strata_generator(seed, 7))
    assert torch.equal(result.strata, labels)
    want = stratified_advantages(torch.tensor([s.reward for s in samples]), labels, N, alpha=0.6)
    assert torch.equal(result.advantages, want.to(torch.float32))
    structural = stratified_advantages(torch.tensor([s.reward for s in samples]), calls, N, alpha=0.6)
    assert not torch.allclose(want, structural)  # the control really trains on other strata


def test_draws_are_reproducible_and_leave_the_global_rng_alone():
    _, calls = _batch(1)
    state = torch.random.get_rng_state()
    a = shuffle_within_groups(calls, N, strata_generator(5, 3))
    b = shuffle_within_groups(calls, N, strata_generator(5, 3))
    c = shuffle_within_groups(calls, N, strata_generator(5, 4))  # next step: new draws
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("k", [1, 2, 3, 8, 11])
def test_random_k_deals_balanced_random_strata(k):
    labels = random_k_strata(50 * N, N, k, strata_generator(0, 1))
    for group in labels.view(-1, N):
        sizes = torch.bincount(group, minlength=min(k, N))
        assert int(sizes.sum()) == N and int(sizes.max()) - int(sizes.min()) <= 1
    if 1 < k < N:
        assert len({tuple(g.tolist()) for g in labels.view(-1, N)}) > 10  # membership varies
    spec = batch_strata({}, f"random_k:{k}", 50 * N, N, generator=strata_generator(0, 1))
    assert torch.equal(spec, labels)


def test_local_config_and_demo_flag_name_a_bad_spec(capsys):
    from openrlhf_sgrpo.demo.options import parse_args
    from openrlhf_sgrpo.local.experience_maker import AdvantageConfig

    with pytest.raises(ValueError, match="'random_k:zero'"):
        AdvantageConfig(stratify_by="random_k:zero")
    assert parse_args(["--smoke", "--stratify-by", "random:tool_calls"]).stratify_by == "random:tool_calls"
    with pytest.raises(SystemExit):
        parse_args(["--smoke", "--stratify-by", "random_k:zero"])
    assert "'random_k:zero'" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["random_k:0", "rand:tool_calls"])
def test_cli_flag_validation_names_the_value(spec):
    from openrlhf_sgrpo.cli.train_ppo_ray import CliError, parse_config

    with pytest.raises(CliError) as exc:
        parse_config(["--algo.advantage.estimator", "stratified_grpo", "--rollout.n_samples_per_prompt", "4",
                      "--algo.advantage.stratify_by", spec])
    assert "--algo.advantage.stratify_by" in str(exc.value) and repr(spec) in str(exc.value)


def test_cli_random_strata_reach_openrlhfs_code_path(openrlhf_gpu_stubs):
    """Through StratifiedExperienceMaker (OpenRLHF's RemoteExperienceMaker subclass): the advantage
    of every sample is stratified_advantages on the labels of step 1's generator."""
    from test_openrlhf_wiring import N as WN
    from test_openrlhf_wiring import make_args, make_experiences, make_maker

    from openrlhf_sgrpo.openrlhf_ext.batch_order import ADVANTAGE_INFO_KEY
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker, run_seed

    exps, rewards, calls = make_experiences(seed=4)
    args = make_args("--algo.advantage.estimator", "stratified_grpo", "--algo.advantage.stratify_by",
                     "random:tool_calls", "--train.seed", "11")
    assert run_seed(args) == 11
    maker = make_maker(StratifiedExperienceMaker, args)
    out = maker.compute_advantages_and_returns(copy.deepcopy(exps))
    labels = shuffle_within_groups(calls, WN, strata_generator(11, 1))
    want = stratified_advantages(rewards, labels, WN, alpha=0.6)
    got = torch.zeros_like(want)
    for e in out:
        got[torch.tensor(e.index)] = e.info[ADVANTAGE_INFO_KEY].to(got.dtype)
    assert torch.equal(got, want)
    second = maker.compute_advantages_and_returns(copy.deepcopy(exps))  # step 2: fresh draws
    got2 = torch.zeros_like(want)
    for e in second:
        got2[torch.tensor(e.index)] = e.info[ADVANTAGE_INFO_KEY].to(got.dtype)
    assert torch.equal(got2, stratified_advantages(rewards, shuffle_within_groups(calls, WN, strata_generator(11, 2)),
                                                   WN, alpha=0.6))


def test_rollout_records_carry_the_drawn_strata_or_no_terms():
    """Records of a random-strata run show the estimator's own labels and terms when the runner
    passes its strata (the local trainer does), and no stratum/group terms when it cannot (the
    cluster's dump): never terms computed on strata the run did not train with."""
    from openrlhf_sgrpo import assets
    from openrlhf_sgrpo.local.experience import Sample
    from openrlhf_sgrpo.local.experience_maker import AdvantageConfig, sample_advantages
    from openrlhf_sgrpo.rollout_records.sources import records_from_samples

    rewards, calls = _batch(2, groups=2)
    samples = [Sample(torch.tensor([1, 2, 3]), torch.ones(3), torch.tensor([0, 1]), None, float(r), float(r), 2, 3,
                      False, False, {"tool_calls": int(c)}, prompt="q", label="a") for r, c in zip(rewards, calls)]
    cfg = AdvantageConfig(estimator="stratified_grpo", alpha=0.6, stratify_by="random:tool_calls")
    result = sample_advantages(samples, N, cfg, generator=strata_generator(0, 1))
    tok = assets.load_qwen2_tokenizer()
    kept = records_from_samples(samples, tok, N, phase="train", step=1, adv_cfg=cfg,
                                advantages=result.advantages, strata=result.strata.tolist())
    got = [s for g in kept for s in g["samples"]]
    assert [s["stratum"] for s in got] == result.strata.tolist()
    san = stratified_advantages(torch.tensor([s.reward for s in samples]), result.strata, N, alpha=1.0)
    assert [s["san"] for s in got] == pytest.approx(san.tolist())
    assert kept[0]["stratify_by"] == "random:tool_calls"  # meta is merged into the group record
    blind = records_from_samples(samples, tok, N, phase="train", step=1, adv_cfg=cfg, advantages=result.advantages)
    got = [s for g in blind for s in g["samples"]]
    assert [s["stratum"] for s in got] == calls.tolist() and all(s["san"] is None for s in got)
    assert [s["advantage"] for s in got] == pytest.approx(result.advantages.tolist())
