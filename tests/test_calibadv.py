"""CalibAdv: hand-made multi-turn groups with known silver docs -> the exact token advantages.

Then the wiring: the agent's ``turn{k}_*`` info slots (agent_env.info_keys) through OpenRLHF's
real experience maker (ours), for GRPO and Stratified GRPO alike.
"""

from __future__ import annotations

import copy

import pytest
import torch

from openrlhf_sgrpo.calibadv import CalibAdvConfig, calibadv_token_advantages, turn_scores

S, A, P = 1, 3, -1  # search, answer, pad kinds
W = 10  # advantage columns


def group_one():
    """3 rollouts of one prompt; rollout 0 is the only good one (silver docs {10, 11})."""
    kind = [[S, A, P, P], [S, S, S, A], [S, A, P, P]]
    start = [[0, 3, P, P], [0, 2, 4, 6], [0, 2, P, P]]
    end = [[3, 6, P, P], [2, 4, 6, 9], [2, 6, P, P]]
    docs = [[[10, 11], [P, P], [P, P], [P, P]],
            [[10, 50], [10, 10], [11, P], [P, P]],  # s = .5 (50 not silver); 0 (10 seen, dup); 1
            [[50, 60], [P, P], [P, P], [P, P]]]
    adv = [[1.0] * 6 + [0] * 4, [-0.5] * 9 + [0], [-0.5] * 6 + [0] * 4]
    f1, fmt = [1.0, 0.0, 0.8], [True, True, False]  # rollout 2 has F1 .8 but a broken format
    return kind, start, end, docs, adv, f1, fmt


def group_all_positive():
    kind = [[S, A, P, P]] * 3
    start = [[0, 2, P, P]] * 3
    end = [[2, 5, P, P]] * 3
    docs = [[[7, P], [P, P], [P, P], [P, P]]] * 3
    adv = [[1.0] * 5 + [0] * 5, [0.5] * 5 + [0] * 5, [0.0] * 10]
    return kind, start, end, docs, adv, [0.2, 0.1, 0.0], [True] * 3


def tensors(*groups):
    cols = list(zip(*groups))
    cat = lambda i, dt: torch.tensor([row for g in cols[i] for row in g], dtype=dt)
    kind, start, end = (cat(i, torch.long) for i in range(3))
    docs, adv = cat(3, torch.long), cat(4, torch.float32)
    adv = torch.nn.functional.pad(adv, (0, W - adv.shape[1]))
    col = torch.arange(W).view(1, 1, W)
    mask = ((col >= start.unsqueeze(-1)) & (col < end.unsqueeze(-1))).any(1)  # the turns' tokens
    return dict(advantages=adv, turn_kind=kind, turn_start=start, turn_end=end, doc_ids=docs,
                f1=cat(5, torch.float32), format_ok=cat(6, torch.bool), group_size=3, action_mask=mask)


def test_turn_scores_silver_unseen_and_format():
    t = tensors(group_one())
    s = turn_scores(t["doc_ids"], t["turn_kind"], t["f1"], t["format_ok"], 3)
    want = torch.tensor([[1.0, 0, 0, 0], [0.5, 0.0, 1.0, 0], [0.0, 0, 0, 0]])
    torch.testing.assert_close(s, want)
    # with a valid format rollout 2 (F1 .8 >= .7) becomes a silver source: 50 and 60 turn silver
    t["format_ok"][2] = True
    s = turn_scores(t["doc_ids"], t["turn_kind"], t["f1"], t["format_ok"], 3)
    torch.testing.assert_close(s[1], torch.tensor([1.0, 0.0, 1.0, 0]))
    torch.testing.assert_close(s[2], torch.tensor([1.0, 0, 0, 0]))


def test_hand_computed_token_advantages_with_rebalancing_and_all_positive_group():
    out, stats = calibadv_token_advantages(**tensors(group_one(), group_all_positive()))
    r = 3.5 / 3  # answer mass: positives 3 tokens * 1; negatives 3 * .5 + 4 * .5 -> positives * 3.5/3
    want = torch.tensor([
        [1, 1, 1, r, r, r, 0, 0, 0, 0],
        [-.25, -.25, -.5, -.5, 0, 0, -.5, -.5, -.5, 0],  # turns scaled by 1 - s: .5, 1, 0; answer kept
        [-.5] * 6 + [0] * 4,  # s = 0 on its search turn
        [1, 1, 0, 0, 0] + [0] * 5,  # all-positive group: answer segments -> 0, search turns kept
        [.5, .5, 0, 0, 0] + [0] * 5,
        [0] * 10,
    ])
    torch.testing.assert_close(out, want)
    assert stats["calibadv/rebalance_factor"] == pytest.approx(r)
    assert stats["calibadv/rebalanced_group_share"] == 0.5 and stats["calibadv/zeroed_group_share"] == 0.5


@pytest.mark.parametrize("target", [1.0, 0.5])
def test_adjusting_the_negatives_hits_the_target_ratio(target):
    t = tensors(group_one())
    cfg = CalibAdvConfig(adjust="negative", target_ratio=target)
    out, _ = calibadv_token_advantages(**t, config=cfg)
    answer = torch.zeros_like(out, dtype=torch.bool)
    for row, (s, e) in enumerate([(3, 6), (6, 9), (2, 6)]):
        answer[row, s:e] = True
    pos = out[answer].clamp_min(0).sum()
    neg = (-out[answer]).clamp_min(0).sum()
    assert float(neg / pos) == pytest.approx(target)
    assert float(pos) == pytest.approx(3.0)  # positives untouched
    # the negatives' scale is P * target / N = 3 * target / 3.5 on every answer token
    assert float(out[2, 3]) == pytest.approx(-0.5 * 3 * target / 3.5)


def test_only_apply_risky_skips_groups_within_the_target():
    t = tensors(group_one())
    out, stats = calibadv_token_advantages(**t, config=CalibAdvConfig(only_apply_risky=True, target_ratio=1.5))
    assert stats["calibadv/rebalanced_group_share"] == 0.0  # 3.5 / 3 <= 1.5
    assert float(out[0, 4]) == 1.0


def test_aggressive_threshold_and_positive_upper_limit():
    t = tensors(group_one())
    out, _ = calibadv_token_advantages(**t, config=CalibAdvConfig(aggressive_threshold=0.5, rebalance="none"))
    assert out[1, :2].tolist() == [0.0, 0.0]  # s = .5 >= .5 -> 0 instead of -.25
    out, _ = calibadv_token_advantages(**t, config=CalibAdvConfig(positive_upper_limit=True, rebalance="none"))
    # A + (max A - A) * s = -.5 + 1.5 * .5 on turn 0, -.5 + 1.5 on turn 2
    assert out[1, :6].tolist() == pytest.approx([.25, .25, -.5, -.5, 1.0, 1.0])


def test_reset2zero_clears_positive_turns_every_rollout_aced():
    # every rollout's first search found only new silver docs (all three are good rollouts)
    kind = [[S, A]] * 3
    start, end = [[0, 2]] * 3, [[2, 4]] * 3
    docs = [[[5, P], [P, P]]] * 3
    adv = [[1.0] * 4, [1.0] * 4, [-2.0] * 4]
    g = (kind, start, end, docs, adv, [1.0, 0.9, 0.8], [True] * 3)
    out, _ = calibadv_token_advantages(**tensors(g), config=CalibAdvConfig(reset2zero=True, rebalance="none"))
    assert out[0, :2].tolist() == [0.0, 0.0] and out[0, 2:4].tolist() == [1.0, 1.0]
    assert out[2, :2].tolist() == [0.0, 0.0]  # the negative one is softened by s = 1 anyway


@pytest.mark.parametrize("kwargs, match", [
    ({"silver_f1": 1.5}, "silver_f1 must be in"),
    ({"target_ratio": 0.0}, "target_ratio must be a finite number > 0, got 0.0"),
    ({"adjust": "both"}, "adjust must be one of .*'both'"),
    ({"rebalance": "turn"}, "rebalance must be one of .*'turn'"),
    ({"aggressive_threshold": 0.0}, "aggressive_threshold must be in"),
])
def test_bad_config_names_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CalibAdvConfig(**kwargs)


def test_bad_shapes_are_refused():
    t = tensors(group_one())
    with pytest.raises(ValueError, match="not a multiple of group_size=2"):
        calibadv_token_advantages(**{**t, "group_size": 2})
    with pytest.raises(ValueError, match=r"doc_ids must be \[B, T, D\]"):
        calibadv_token_advantages(**{**t, "doc_ids": t["doc_ids"][:, :2]})


# ------------------------------------------------------------------ OpenRLHF wiring

def agent_experiences(group):
    """One Experience per rollout, info slots written as the agent does (token-space ranges)."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    from agent_env import info_keys as K
    from agent_env import metadata as M

    kind, start, end, docs, _, f1, fmt = group
    rewards = [1.0, 0.0, 0.2]
    out = []
    for i in range(3):
        meta = M.empty_metadata(max_turns=3, topk=2)
        mask = torch.zeros(1, W, dtype=torch.bool)
        for k in range(4):
            meta[K.turn_kind_key(k)] = kind[i][k]
            if kind[i][k] != P:
                meta[K.turn_start_key(k)], meta[K.turn_end_key(k)] = start[i][k] + 1, end[i][k] + 1
                mask[0, start[i][k]:end[i][k]] = True
            for j in range(2):
                meta[K.turn_doc_key(k, j)] = docs[i][k][j]
        meta.update({K.F1: f1[i], K.ANSWERED: int(fmt[i]), K.INVALID_ACTIONS: 0,
                     K.SEARCH_CALLS: sum(x == S for x in kind[i]), K.TOOL_CALLS: sum(x == S for x in kind[i])})
        out.append(Experience(
            sequences=torch.ones(1, W + 1, dtype=torch.long), action_mask=mask, kl=torch.zeros(1, W),
            rewards=torch.tensor([rewards[i]]), response_length=mask.sum(-1), truncated=torch.tensor([False]),
            index=[i], info={k: torch.tensor([v]) for k, v in meta.items()}))
    return out


@pytest.mark.parametrize("estimator", ["group_norm", "stratified_grpo"])
def test_experience_maker_applies_calibadv_after_any_estimator(openrlhf_gpu_stubs, estimator):
    from types import SimpleNamespace

    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    def run(*flags):
        args = parse_config(["--algo.advantage.estimator", estimator, "--rollout.n_samples_per_prompt", "3",
                             "--algo.advantage.stratify_by", "search_calls", *flags])
        maker = StratifiedExperienceMaker(None, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args),
                                          tokenizer=None)
        return maker.compute_advantages_and_returns(list(reversed(agent_experiences(group_one()))))

    plain = run()
    calibrated = run("--algo.calibadv.enable")
    order = {e.index[0]: e for e in plain}
    base = torch.cat([order[i].advantages for i in range(3)])
    t = tensors(group_one())
    t["advantages"] = base
    assert torch.equal(t["action_mask"], torch.cat([order[i].action_mask for i in range(3)]))
    want, _ = calibadv_token_advantages(**t)
    got = {e.index[0]: e for e in calibrated}
    torch.testing.assert_close(torch.cat([got[i].advantages for i in range(3)]), want)
    assert not torch.equal(want, base)  # the calibration changed something
    assert "calibadv/mean_turn_score" in got[0].info and "calibadv/mean_turn_score" not in order[0].info
    # the theorem monitors ride along for every estimator
    assert "sgrpo/between_stratum_term" in got[0].info


def test_missing_turn_slots_name_the_agent(openrlhf_gpu_stubs):
    from openrlhf_sgrpo.openrlhf_ext.calibadv_hook import turn_tensors

    with pytest.raises(KeyError, match="agent_env.openrlhf_agent"):
        turn_tensors({"f1": torch.tensor([1.0])})
    exps = agent_experiences(group_one())
    info = copy.deepcopy(exps[0].info)
    del info["f1"]
    with pytest.raises(KeyError, match="'f1'"):
        turn_tensors(info)
