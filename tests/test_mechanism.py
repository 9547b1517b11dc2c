"""The mechanism on the log: advantage mass per tool-call stratum, SAN and GN parts apart.

The identities that make it a check: SAN's mass is zero in every tool-call stratum when the
estimator stratifies by tool calls, so Stratified GRPO's mass there is (1 - alpha) times GRPO's;
with random strata SAN's mass leaks across tool-call strata. Then the keys in both logs.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from openrlhf_sgrpo.advantages import group_normalized_advantages, stratified_advantages
from openrlhf_sgrpo.mechanism import (
    MAX_STRATUM,
    METRIC_KEYS,
    STRATUM_NAMES,
    estimator_mechanism,
    mechanism_metrics,
    stratum_name,
)
from openrlhf_sgrpo.strata import shuffle_within_groups, strata_generator

N = 8
ALPHAS = (0.3, 0.6, 1.0)


def _batch(seed: int, groups: int = 16, n: int = N):
    g = torch.Generator().manual_seed(seed)
    calls = torch.randint(0, 7, (groups * n,), generator=g)  # counts past MAX_STRATUM merge
    rewards = (torch.rand(groups * n, generator=g, dtype=torch.float64) < 0.2 + 0.1 * calls).to(torch.float64)
    rewards += 0.1 * torch.rand(groups * n, generator=g, dtype=torch.float64)
    return rewards, calls


def _field(m: dict, field: str) -> list[float]:
    return [m[f"sgrpo/{name}/{field}"] for name in STRATUM_NAMES]


def test_names_and_bounded_keys():
    assert STRATUM_NAMES == ("stratum0", "stratum1", "stratum2", "stratum3", "stratum4plus")
    assert stratum_name(9) == f"stratum{MAX_STRATUM}plus" and len(METRIC_KEYS) == 25
    assert "sgrpo/stratum2/adv_mass_san" in METRIC_KEYS
    with pytest.raises(ValueError, match="-1"):
        stratum_name(-1)


def test_hand_computed_batch():
    # one group of 4: tool calls [0, 0, 1, 5], rewards [0, 1, 1, 1]; GN population std, eps 0
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    calls = torch.tensor([0, 0, 1, 5])
    gn = group_normalized_advantages(rewards, 4, 0.0)  # mean 0.75, std sqrt(3)/4
    s = math.sqrt(3) / 4
    torch.testing.assert_close(gn, torch.tensor([-0.75 / s, 0.25 / s, 0.25 / s, 0.25 / s], dtype=torch.float64))
    san = stratified_advantages(rewards, calls, 4, alpha=1.0, eps=0.0)  # stratum 0: [-1, 1]; singletons 0
    m = mechanism_metrics(rewards, calls, gn, san, alpha=0.5)
    assert _field(m, "share") == [0.5, 0.25, 0.0, 0.0, 0.25]
    assert m["sgrpo/stratum0/reward"] == 0.5 and m["sgrpo/stratum4plus/reward"] == 1.0
    assert math.isnan(m["sgrpo/stratum2/reward"])  # empty: undefined mean, zero share and mass
    assert m["sgrpo/stratum2/adv_mass"] == 0.0
    assert m["sgrpo/stratum0/adv_mass_gn"] == pytest.approx(0.5 * (-0.5 / s) / 4)
    assert m["sgrpo/stratum1/adv_mass_gn"] == pytest.approx(0.5 * (0.25 / s) / 4)
    assert all(v == pytest.approx(0.0, abs=1e-15) for v in _field(m, "adv_mass_san"))
    for name in STRATUM_NAMES:
        b = f"sgrpo/{name}/"
        assert m[b + "adv_mass"] == pytest.approx(m[b + "adv_mass_san"] + m[b + "adv_mass_gn"])


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("alpha", ALPHAS)
def test_san_mass_is_zero_in_every_tool_call_stratum(seed, alpha):
    rewards, calls = _batch(seed)
    m = estimator_mechanism("stratified_grpo", rewards, calls, calls, N, alpha)
    assert max(abs(v) for v in _field(m, "adv_mass_san")) < 1e-12
    assert sum(_field(m, "share")) == pytest.approx(1.0)
    assert sum(_field(m, "adv_mass")) == pytest.approx(0.0, abs=1e-12)  # GN sums to 0 per group


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("alpha", ALPHAS)
def test_sgrpo_mass_is_one_minus_alpha_times_grpos(seed, alpha):
    rewards, calls = _batch(seed)
    sgrpo = estimator_mechanism("stratified_grpo", rewards, calls, calls, N, alpha)
    grpo = estimator_mechanism("grpo", rewards, calls, calls, N, alpha)  # grpo ignores alpha: 0
    assert max(abs(v) for v in _field(grpo, "adv_mass_san")) == 0.0
    assert _field(grpo, "adv_mass") == _field(grpo, "adv_mass_gn")
    for got, want in zip(_field(sgrpo, "adv_mass"), _field(grpo, "adv_mass")):
        assert got == pytest.approx((1 - alpha) * want, abs=1e-12)
    assert any(abs(v) > 1e-3 for v in _field(grpo, "adv_mass"))  # the identity is not 0 == 0
    # the blend it measures is the advantage the estimator trains with
    adv = stratified_advantages(rewards, calls, N, alpha=alpha)
    tail = calls >= MAX_STRATUM
    assert sgrpo["sgrpo/stratum4plus/adv_mass"] == pytest.approx(float(adv[tail].sum()) / len(adv), abs=1e-12)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_random_strata_san_mass_leaks_across_tool_call_strata(alpha):
    leaks = []
    for seed in range(10):
        rewards, calls = _batch(seed)
        labels = shuffle_within_groups(calls, N, strata_generator(seed, 1))
        m = estimator_mechanism("stratified_grpo", rewards, labels, calls, N, alpha)
        leaks.append(max(abs(v) for v in _field(m, "adv_mass_san")))
        assert sum(_field(m, "adv_mass_san")) == pytest.approx(0.0, abs=1e-12)  # still 0 over the batch
    assert sum(v > 1e-3 for v in leaks) >= 9


@pytest.mark.parametrize("estimator", ["stratified_reinforce", "stratified_rloo"])
def test_other_estimators_split_their_own_blend(estimator):
    from openrlhf_sgrpo.advantages import compute_stratified

    rewards, calls = _batch(2)
    m = estimator_mechanism(estimator, rewards, calls, calls, N, 0.6)
    adv = compute_stratified(estimator, rewards, calls, N, 0.6)
    for k, name in enumerate(STRATUM_NAMES):
        sel = calls.clamp_max(MAX_STRATUM) == k
        assert m[f"sgrpo/{name}/adv_mass"] == pytest.approx(float(adv[sel].sum()) / len(adv), abs=1e-12)


@pytest.mark.parametrize("kwargs, match", [
    (dict(alpha=1.5), "alpha must be in"),
    (dict(alpha=0.5, stratum_term=None), "pass stratum_term"),
    (dict(tool_calls=torch.tensor([0, 1])), "tool_calls shape"),
    (dict(tool_calls=torch.tensor([0.5, 1.0, 0.0, 2.0])), "integer counts"),
    (dict(tool_calls=torch.tensor([-1, 1, 0, 2])), "counts >= 0"),
])
def test_bad_input_names_the_value(kwargs, match):
    base = dict(rewards=torch.ones(4), tool_calls=torch.tensor([0, 1, 0, 2]), group_term=torch.zeros(4),
                stratum_term=torch.zeros(4), alpha=0.5)
    with pytest.raises(ValueError, match=match):
        mechanism_metrics(**{**base, **kwargs})


@pytest.mark.parametrize("estimator", ["stratified_grpo", "group_norm", "rloo"])
def test_cluster_experience_maker_logs_the_mechanism(openrlhf_gpu_stubs, estimator):
    """OpenRLHF's actor logs every Experience.info tensor: the sgrpo/stratum* keys ride there as
    per-sample batch constants, like the monitors. For upstream estimators the logged GN mass is
    the mass of the advantage upstream's own code computed (kl_coef 0: the token advantage at the
    first action token is the sequence-level one)."""
    from test_openrlhf_wiring import last_action_advantage, make_args, make_experiences, make_maker

    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    exps, rewards, calls = make_experiences(seed=3)
    maker = make_maker(StratifiedExperienceMaker, make_args("--algo.advantage.estimator", estimator))
    out = maker.compute_advantages_and_returns(copy.deepcopy(exps))
    for e in out:
        assert set(METRIC_KEYS) <= set(e.info)
        assert all(e.info[k].shape == (len(e.index),) for k in METRIC_KEYS)
    logged = {k: float(out[0].info[k][0]) for k in METRIC_KEYS}
    adv = last_action_advantage(out).to(torch.float64)
    for k, name in enumerate(STRATUM_NAMES):
        sel = calls.clamp_max(MAX_STRATUM) == k
        assert logged[f"sgrpo/{name}/share"] == pytest.approx(float(sel.sum()) / len(calls))
        assert logged[f"sgrpo/{name}/adv_mass"] == pytest.approx(float(adv[sel].sum()) / len(adv), abs=1e-5)
    if estimator == "stratified_grpo":  # strata = tool calls: SAN mass 0 (float32 info tensors)
        assert max(abs(logged[f"sgrpo/{n}/adv_mass_san"]) for n in STRATUM_NAMES) < 1e-6
    else:
        assert all(logged[f"sgrpo/{n}/adv_mass_san"] == 0.0 for n in STRATUM_NAMES)
