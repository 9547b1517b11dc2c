"""Stratified estimators: hand-computed Algorithm 1 cases and the paper's statements as properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from openrlhf_sgrpo.advantages import (
    compute_stratified,
    stratified_advantages,
    stratified_baseline_advantages,
    stratified_rloo_advantages,
)
from openrlhf_sgrpo.metrics import stratification_metrics

T = torch.tensor


def test_algorithm1_hand_computed_two_strata():
    # one prompt, 4 samples; stratum 0 = {1, 0}, stratum 1 = {1, 1}
    r = T([1.0, 0.0, 1.0, 1.0])
    s = T([0, 0, 1, 1])
    # GN: mean .75, population std sqrt(3)/4
    std = math.sqrt(3) / 4
    a_gn = [(x - 0.75) / std for x in (1, 0, 1, 1)]
    # SAN: stratum 0 -> (+1, -1); stratum 1 constant -> 0
    a_san = [1.0, -1.0, 0.0, 0.0]
    got = stratified_advantages(r, s, 4, alpha=0.6, eps=0.0)
    want = [0.6 * x + 0.4 * y for x, y in zip(a_san, a_gn)]
    assert got.tolist() == pytest.approx(want, abs=1e-6)


def test_algorithm1_hand_computed_two_prompts_with_eps_and_singletons():
    r = T([2.0, 0.0, 1.0, 3.0, 5.0, 5.0])
    s = T([1, 1, 0, 0, 2, 9])  # prompt 2 (3.0, 5.0, 5.0): all singletons
    eps = 0.5
    got = stratified_advantages(r, s, 3, alpha=0.5, eps=eps)
    # prompt 1: GN mean 1, pop std sqrt(2/3); SAN stratum {2,0}: mean 1, std 1; singleton -> 0
    g1 = math.sqrt(2 / 3)
    p1 = [0.5 * (1 / (1 + eps)) + 0.5 * (1 / (g1 + eps)),
          0.5 * (-1 / (1 + eps)) + 0.5 * (-1 / (g1 + eps)),
          0.5 * 0.0 + 0.5 * 0.0]
    g2m, g2s = 13 / 3, math.sqrt(((3 - 13 / 3) ** 2 + 2 * (5 - 13 / 3) ** 2) / 3)
    p2 = [0.5 * (x - g2m) / (g2s + eps) for x in (3.0, 5.0, 5.0)]
    assert got.tolist() == pytest.approx(p1 + p2, abs=1e-6)


def test_unbiased_std_switches_both_stds():
    r = T([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    s = T([0, 0, 0, 1, 1, 1])
    got = stratified_advantages(r, s, 6, alpha=0.5, eps=0.0, std="unbiased")
    gn = (r - r.mean()) / r.std()
    san = torch.cat([(x - x.mean()) / x.std() for x in r.split(3)])
    assert torch.allclose(got, 0.5 * san + 0.5 * gn.to(got.dtype), atol=1e-6)


def test_alpha_zero_is_grpo_and_alpha_one_is_san():
    torch.manual_seed(0)
    r = torch.rand(5 * 8)
    s = torch.randint(0, 3, (40,))
    gn = ((r.view(5, 8) - r.view(5, 8).mean(1, keepdim=True)) / (r.view(5, 8).std(1, unbiased=False, keepdim=True)
                                                                + 1e-6)).reshape(-1)
    assert torch.allclose(stratified_advantages(r, s, 8, alpha=0.0), gn, atol=1e-5)
    # alpha=1 ignores the group: changing only another stratum's rewards leaves a stratum's SAN alone
    a1 = stratified_advantages(r, s, 8, alpha=1.0)
    r2 = r.clone()
    r2[s == 2] += 10.0
    a2 = stratified_advantages(r2, s, 8, alpha=1.0)
    assert torch.allclose(a1[s != 2], a2[s != 2], atol=1e-5)


def test_large_or_negative_strata_ids_use_the_general_path():
    r = T([1.0, 0.0, 1.0, 0.5, 0.2, 0.9])
    small = T([0, 0, 1, 0, 1, 1])
    sparse = T([-7, -7, 10**12, 3, 99, 99])  # same partition per prompt, arbitrary ids
    for fn in (stratified_advantages, stratified_baseline_advantages, stratified_rloo_advantages):
        assert torch.allclose(fn(r, small, 3), fn(r, sparse, 3), atol=1e-6)


def test_stratified_baseline_hand_computed():
    r = T([1.0, 0.0, 1.0, 1.0])
    s = T([0, 0, 1, 1])
    got = stratified_baseline_advantages(r, s, 4, alpha=0.5)
    want = [0.5 * 0.5 + 0.5 * 0.25, 0.5 * -0.5 + 0.5 * -0.75, 0.5 * 0 + 0.5 * 0.25, 0.5 * 0 + 0.5 * 0.25]
    assert got.tolist() == pytest.approx(want)


def test_stratified_rloo_hand_computed_with_singleton_fallback():
    r = T([1.0, 0.0, 0.5, 0.3])
    s = T([0, 0, 0, 1])  # stratum 0 has 3 members, stratum 1 is a singleton
    got = stratified_rloo_advantages(r, s, 4, alpha=1.0)
    want = [1 - 0.25, 0 - 0.75, 0.5 - 0.5, 0.3 - (1.5 / 3)]  # singleton: prompt-group LOO
    assert got.tolist() == pytest.approx(want)


@pytest.mark.parametrize("bad, match", [
    (dict(alpha=1.5), "alpha must be in"),
    (dict(alpha=-0.1), "alpha must be in"),
    (dict(n=1), "n_samples_per_prompt must be"),
    (dict(n=3), "not a positive multiple"),
    (dict(rewards=T([1.0, float("nan"), 0.0, 1.0])), r"rewards\[1\] = nan"),
    (dict(rewards=T([1.0, float("inf"), 0.0, 1.0])), "must be finite"),
    (dict(strata=T([0.0, 1.0, 0.0, 1.0])), "integer tensor"),
    (dict(strata=T([0, 1, 0])), "strata shape"),
    (dict(std="sample"), "std must be one of"),
])
def test_bad_input_names_the_value(bad, match):
    kw = dict(rewards=T([1.0, 0.0, 0.0, 1.0]), strata=T([0, 1, 0, 1]), n=2, alpha=0.6, std="population")
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        stratified_advantages(kw["rewards"], kw["strata"], kw["n"], alpha=kw["alpha"], std=kw["std"])


def test_unknown_estimator_is_refused():
    with pytest.raises(ValueError, match="unknown stratified estimator 'stratified_ppo'"):
        compute_stratified("stratified_ppo", T([1.0, 0.0]), T([0, 0]), 2, 0.5)


# ---------------------------------------------------------------- properties (the paper's statements)

@st.composite
def batches(draw, max_prompts=6, max_n=8, max_strata=4, grid=False):
    """Random prompt-contiguous batches; ``grid`` keeps rewards on multiples of 1/4 so that
    spreads are either exactly 0 or well above float rounding (affine-invariance checks)."""
    n = draw(st.integers(2, max_n))
    p = draw(st.integers(1, max_prompts))
    values = st.integers(-20, 20).map(lambda v: v / 4) if grid else st.floats(-5, 5, allow_nan=False, width=32)
    rewards = draw(st.lists(values, min_size=n * p, max_size=n * p))
    strata = draw(st.lists(st.integers(0, max_strata - 1), min_size=n * p, max_size=n * p))
    return T(rewards, dtype=torch.float64), T(strata), n


@settings(max_examples=100, deadline=None)
@given(batches(), st.floats(0, 1))
def test_per_prompt_mean_zero_of_san_gn_and_blend(batch, alpha):
    r, s, n = batch
    for a in (0.0, 1.0, alpha):
        adv = stratified_advantages(r, s, n, alpha=a, eps=1e-6)
        assert torch.allclose(adv.view(-1, n).sum(1), torch.zeros(len(r) // n, dtype=adv.dtype), atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(batches(grid=True), st.floats(0.1, 10), st.floats(-10, 10))
# Found by CI: 3 * 1.6815 / 3 != 1.6815 in float64, so a constant stratum had a 1e-16 std and
# SAN -1 at eps=0 before the moments were taken over values shifted by the segment's first.
@example((torch.tensor([-0.25] * 3, dtype=torch.float64), torch.tensor([0, 0, 0]), 3), 1.2739418954039845, 2.0)
def test_proposition2_san_invariant_to_positive_affine_rewards(batch, a, b):
    r, s, n = batch
    base = stratified_advantages(r, s, n, alpha=1.0, eps=0.0)
    moved = stratified_advantages(a * r + b, s, n, alpha=1.0, eps=0.0)
    assert torch.allclose(base, moved, atol=1e-5, rtol=1e-4)


@settings(max_examples=100, deadline=None)
@given(batches())
def test_theorem1_variance_identity(batch):
    r, s, n = batch
    m = stratification_metrics(r, s, n)
    assert m["sgrpo/var_adv_global"] - m["sgrpo/var_adv_stratified"] == pytest.approx(
        m["sgrpo/between_stratum_term"], abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(batches())
def test_proposition1_and_theorem2_decomposition(batch):
    """Global-baseline advantage = stratified-baseline advantage + (stratum mean - prompt mean),
    and the global variance splits into within-stratum plus between-stratum parts."""
    r, s, n = batch
    a_g = stratified_baseline_advantages(r, s, n, alpha=0.0)  # R - Rbar
    a_s = stratified_baseline_advantages(r, s, n, alpha=1.0)  # R - Rbar_k
    offset = a_g - a_s  # Rbar_k - Rbar, constant inside each (prompt, stratum)
    for p in range(len(r) // n):
        sl = slice(p * n, (p + 1) * n)
        for k in s[sl].unique():
            vals = offset[sl][s[sl] == k]
            assert torch.allclose(vals, vals[0].expand_as(vals), atol=1e-9)
        # cross term vanishes: sum_i A_S,i * offset_i = 0 within a prompt
        assert float((a_s[sl] * offset[sl]).sum()) == pytest.approx(0.0, abs=1e-6)
        assert float((a_g[sl] ** 2).sum()) == pytest.approx(float((a_s[sl] ** 2).sum() + (offset[sl] ** 2).sum()),
                                                            abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(batches())
def test_theorem4_and_5_for_san(batch):
    r, s, n = batch
    m = stratification_metrics(r, s, n, stratified_advantages(r, s, n, alpha=1.0, eps=0.0), eps=0.0)
    if not math.isnan(m["sgrpo/in_stratum_var_san"]):
        assert m["sgrpo/in_stratum_var_san"] == pytest.approx(1.0, abs=1e-6)
    assert m["sgrpo/global_var_san"] <= 1.0 + 1e-9


@settings(max_examples=100, deadline=None)
@given(batches())
def test_rloo_and_baseline_are_zero_mean_per_stratum_when_no_singletons(batch):
    r, s, n = batch
    adv = stratified_rloo_advantages(r, s, n, alpha=1.0)
    for p in range(len(r) // n):
        sl = slice(p * n, (p + 1) * n)
        for k in s[sl].unique():
            members = s[sl] == k
            if int(members.sum()) > 1:
                assert float(adv[sl][members].sum()) == pytest.approx(0.0, abs=1e-6)


@settings(max_examples=300, deadline=None)
@given(st.floats(-1e6, 1e6, allow_nan=False), st.integers(2, 16), st.sampled_from([torch.float32, torch.float64]),
       st.sampled_from(["population", "unbiased"]))
def test_a_constant_group_or_stratum_gets_exactly_zero_whatever_its_value(value, n, dtype, std):
    """Every estimator, any eps: equal rewards mean no signal, to the bit (not an ulp of noise / ulp)."""
    r = torch.full((2 * n,), value, dtype=dtype)
    strata = torch.tensor([0, 1] * n)
    for est in ("stratified_grpo", "stratified_reinforce", "stratified_rloo"):
        for eps in (0.0, 1e-6):
            adv = compute_stratified(est, r, strata, n, 0.6, eps, std)
            assert torch.equal(adv, torch.zeros_like(adv)), (est, eps, adv)
