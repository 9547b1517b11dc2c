"""CalibAdv: hand-made multi-turn groups with known silver docs -> the exact token advantages.

First the five rules where the authors' code (github.com/wujwyi/CalibAdv, read, not copied)
differs from what this project did before, each restated on a group built by hand (one test per
rule; docs/sapo_calibadv.md maps rule -> authors -> ours -> test), then the parts that did not
change (scoring, rebalancing, the options, bad input), then the wiring: the agent's
``turn{k}_*`` info slots (agent_env.info_keys) through OpenRLHF's real experience maker (ours),
for GRPO and Stratified GRPO alike. The inputs coming from real agent episodes are in
tests/test_calibadv_inputs.py.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

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
                think_sim=torch.full(kind.shape, -1.0), f1=cat(5, torch.float32), format_ok=cat(6, torch.bool),
                group_size=3, action_mask=mask)


def scores_of(t: dict, config: CalibAdvConfig | None = None) -> torch.Tensor:
    return turn_scores(t["doc_ids"], t["turn_kind"], t["f1"], t["format_ok"], t["group_size"], config=config,
                       think_sim=t["think_sim"])


def test_turn_scores_silver_unseen_and_format():
    t = tensors(group_one())
    want = torch.tensor([[1.0, 0, 0, 0], [0.5, 0.0, 1.0, 0], [0.0, 0, 0, 0]])
    torch.testing.assert_close(scores_of(t), want)
    # rollout 2 (F1 .8, below the group's best 1.0) adds no silver docs even with a valid format,
    # but it is scored then: its 50 and 60 are not silver, so 0
    t["format_ok"][2] = True
    torch.testing.assert_close(scores_of(t), want)
    # the project's earlier rule (every good rollout supplies silver docs) stays an option
    s = scores_of(t, CalibAdvConfig(silver_from="all_good"))
    torch.testing.assert_close(s[1], torch.tensor([1.0, 0.0, 1.0, 0]))
    torch.testing.assert_close(s[2], torch.tensor([1.0, 0, 0, 0]))


# ------------------------------------------------------------------ the authors' rules, one test each

@dataclass(frozen=True)
class Turn:
    """One turn of a hand-built rollout: its kind, token count, retrieved docs and think similarity."""

    kind: int
    tokens: int = 2
    docs: tuple[int, ...] = ()
    think_sim: float = -1.0  # -1: no earlier search turn to compare with


@dataclass(frozen=True)
class Rollout:
    turns: tuple[Turn, ...]
    adv: float  # the estimator's advantage, on every action token
    f1: float
    format_ok: bool = True


def batch(*rollouts: Rollout, width: int = 12) -> dict:
    """Tensors for ``calibadv_token_advantages``: turns laid out back to back from column 0."""
    b = len(rollouts)
    t = max(len(r.turns) for r in rollouts)
    d = max([len(turn.docs) for r in rollouts for turn in r.turns] + [1])
    kind, start, end = (torch.full((b, t), P) for _ in range(3))
    docs, sim = torch.full((b, t, d), P), torch.full((b, t), -1.0)
    adv, mask = torch.zeros(b, width), torch.zeros(b, width, dtype=torch.bool)
    for i, r in enumerate(rollouts):
        col = 0
        for k, turn in enumerate(r.turns):
            kind[i, k], start[i, k], end[i, k] = turn.kind, col, col + turn.tokens
            docs[i, k, : len(turn.docs)] = torch.tensor(turn.docs, dtype=torch.long)
            sim[i, k] = turn.think_sim
            adv[i, col: col + turn.tokens], mask[i, col: col + turn.tokens] = r.adv, True
            col += turn.tokens
    return dict(advantages=adv, turn_kind=kind, turn_start=start, turn_end=end, doc_ids=docs, think_sim=sim,
                f1=torch.tensor([r.f1 for r in rollouts]), format_ok=torch.tensor([r.format_ok for r in rollouts]),
                group_size=b, action_mask=mask)


def calibrate(t: dict, **options) -> torch.Tensor:
    out, _ = calibadv_token_advantages(**t, config=CalibAdvConfig(**options) if options else None)
    return out


def answer(tokens: int = 2) -> Turn:
    return Turn(A, tokens)


def test_rule1_silver_docs_come_only_from_the_best_formatted_rollouts():
    """Silver docs are those of the well-formatted rollouts at the group's highest F1, and only
    when that F1 reaches 0.7; rollouts tied at the top pool their docs. A good rollout below the
    top adds none, nor does an ill-formatted one, whatever its F1."""
    t = batch(
        Rollout((Turn(S, docs=(1, 2)), answer()), adv=1.0, f1=0.9),  # top (tied): 1, 2 are silver
        Rollout((Turn(S, docs=(3,)), answer()), adv=1.0, f1=0.9),  # top (tied): 3 is silver
        Rollout((Turn(S, docs=(4, 5)), answer()), adv=0.5, f1=0.8),  # >= 0.7 but below the top: no
        Rollout((Turn(S, docs=(6,)), answer()), adv=0.5, f1=1.0, format_ok=False),  # broken format: no
        Rollout((Turn(S, docs=(1, 3, 4, 6)), answer()), adv=-1.0, f1=0.0),  # 2 of 4 silver: s = .5
        Rollout((Turn(S, docs=(5, 7)), answer()), adv=-1.0, f1=0.0),  # none silver: s = 0
    )
    out = calibrate(t)
    assert out[4, :2].tolist() == [-0.5, -0.5]  # A * (1 - .5)
    assert out[5, :2].tolist() == [-1.0, -1.0]
    # the top is below 0.7 (the ill-formatted F1 of 1.0 does not count): no silver docs at all
    low = batch(Rollout((Turn(S, docs=(1,)), answer()), adv=1.0, f1=0.6),
                Rollout((Turn(S, docs=(2,)), answer()), adv=1.0, f1=1.0, format_ok=False),
                Rollout((Turn(S, docs=(1, 2)), answer()), adv=-1.0, f1=0.0))
    assert calibrate(low)[2, :2].tolist() == [-1.0, -1.0]


def test_rule2_only_well_formatted_rollouts_are_calibrated():
    """A rollout that fails the format check (agent key format_ok: tags in order, a search, an
    answer, no invalid action) keeps its advantage on every search turn, even one that retrieved
    only new silver docs; a well-formatted one with the same turn is softened."""
    t = batch(
        Rollout((Turn(S, docs=(1, 2)), answer()), adv=1.0, f1=1.0),  # the silver source
        Rollout((Turn(S, docs=(1, 2)), answer()), adv=-1.0, f1=0.0),  # formatted: s = 1 -> 0
        Rollout((Turn(S, docs=(1, 2)), answer()), adv=-1.0, f1=0.0, format_ok=False),  # stray text
        Rollout((Turn(S, docs=(2, 1)), Turn(S, docs=(P,))), adv=-1.0, f1=0.0, format_ok=False),  # no answer
    )
    out = calibrate(t)
    assert out[1, :2].tolist() == [0.0, 0.0]
    assert out[2, :2].tolist() == [-1.0, -1.0]
    assert out[3, :4].tolist() == [-1.0] * 4
    # the project's earlier rule (every rollout scored) stays an option
    assert calibrate(t, scored_rollouts="all")[2, :2].tolist() == [0.0, 0.0]


def test_rule3_a_search_turn_repeating_earlier_reasoning_earns_nothing():
    """A search turn whose <think> is MORE than 0.5 alike (word edit similarity, computed by the
    agent) to an earlier search turn's scores 0; exactly 0.5 still scores."""
    t = batch(
        Rollout((Turn(S, docs=(1, 2)), Turn(S, docs=(3, 4)), answer()), adv=1.0, f1=1.0),
        Rollout((Turn(S, docs=(1,)), Turn(S, docs=(2,), think_sim=0.75), Turn(S, docs=(3,), think_sim=0.5),
                 Turn(S, docs=(4,), think_sim=0.51), answer()), adv=-1.0, f1=0.0),
    )
    out = calibrate(t)
    assert out[1, :10].tolist() == [0, 0, -1, -1, 0, 0, -1, -1, -1, -1]
    assert calibrate(t, think_similarity=None)[1, :8].tolist() == [0.0] * 8  # the rule off


def test_rule4_a_search_turn_sharing_two_docs_with_one_earlier_turn_earns_nothing():
    """A search turn that has 2 or more distinct documents in common with ONE earlier search turn
    scores 0, even if it also found a new silver doc; one shared doc with each of several earlier
    turns is not enough, and a document listed twice in a turn counts once."""
    t = batch(
        Rollout((Turn(S, tokens=2, docs=(1, 2, 3, 4, 5)), answer(10)), adv=1.0, f1=1.0),  # silver 1-5
        Rollout((Turn(S, docs=(1, 8, 9)),  # 1 new silver of 3: s = 1/3
                 Turn(S, docs=(8, 9, 2)),  # shares 8, 9 with turn 0 -> 0 (2 is new silver)
                 Turn(S, docs=(1, 3)),  # shares only 1 with turn 0: 3 new silver of 2 -> 1/2
                 Turn(S, docs=(9, 3, 4, 4)),  # one in common with each earlier turn: 4 new of 4 -> 1/4
                 Turn(S, docs=(2, 2, 5)),  # 2 twice shares one distinct doc with turn 1: 5 new -> 1/3
                 answer()), adv=-1.0, f1=0.0),
    )
    out = calibrate(t)
    want = [-2 / 3, -1.0, -0.5, -0.75, -2 / 3]
    assert out[1, :10].tolist() == pytest.approx([w for w in want for _ in range(2)])
    assert calibrate(t, shared_docs=None)[1, 2:4].tolist() == pytest.approx([-2 / 3] * 2)  # the rule off


def test_rule5_the_soft_penalty_comes_before_the_rebalancing():
    """By default turns are softened first and the group is rebalanced after, on the softened
    advantages. Visible when the rebalanced tokens include search turns (rebalance="response"):
    the negative mass is 3 (one search turn halved), so the positives shrink by 3/4."""
    t = batch(Rollout((Turn(S, docs=(1, 2)), answer()), adv=1.0, f1=1.0),
              Rollout((Turn(S, docs=(1, 9)), answer()), adv=-1.0, f1=0.0))
    out = calibrate(t, rebalance="response")
    assert out[0, :4].tolist() == [0.75] * 4
    assert out[1, :4].tolist() == [-0.5, -0.5, -1.0, -1.0]
    # the other order (the project's earlier default) stays an option: balanced masses 4 = 4 first
    out = calibrate(t, rebalance="response", softpenalty_first=False)
    assert out[0, :4].tolist() == [1.0] * 4 and out[1, :4].tolist() == [-0.5, -0.5, -1.0, -1.0]


def test_defaults_are_the_authors_settings():
    """The settings the authors' train_grpo.sh means (adjust_positive, only_answer, in_group,
    target_ratio 1, softpenalty_first, query score "old") with the rules of their code."""
    cfg = CalibAdvConfig()
    assert (cfg.silver_f1, cfg.silver_from, cfg.scored_rollouts, cfg.think_similarity, cfg.shared_docs) == \
        (0.7, "best", "format_ok", 0.5, 2)
    assert (cfg.adjust, cfg.rebalance, cfg.target_ratio, cfg.softpenalty_first, cfg.only_apply_risky) == \
        ("positive", "answer", 1.0, True, False)
    assert (cfg.aggressive_threshold, cfg.positive_upper_limit, cfg.reset2zero) == (None, False, False)


# ------------------------------------------------------------------ what did not change

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


def test_reset2zero_counts_scored_rollouts_only_and_the_upper_limit_starts_at_zero():
    """Two details of the authors' options: reset2zero looks at the scored (well-formatted)
    rollouts only, and positive_upper_limit lifts toward the group's best advantage but never
    toward less than 0 (their running maximum starts at 0)."""
    t = batch(Rollout((Turn(S, docs=(5,)), answer()), adv=1.0, f1=1.0),
              Rollout((Turn(S, docs=(5,)), answer()), adv=1.0, f1=0.9),
              Rollout((Turn(S, docs=(6,)), answer()), adv=1.0, f1=0.9, format_ok=False),  # not scored
              Rollout((Turn(S, docs=(5,)), answer()), adv=-3.0, f1=0.0))
    out = calibrate(t, reset2zero=True, rebalance="none")
    assert out[:3, :2].tolist() == [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]  # every scored one aced turn 0
    # a non-centred estimator can leave a whole group negative: the lift then goes toward 0
    t = batch(Rollout((Turn(S, docs=(1,)), answer()), adv=-0.5, f1=1.0),
              Rollout((Turn(S, docs=(1, 2)), answer()), adv=-1.0, f1=0.0))
    out = calibrate(t, positive_upper_limit=True, rebalance="none")
    assert out[:, :2].tolist() == [[0.0, 0.0], [-0.5, -0.5]]  # A + (0 - A) * s with s = 1 and 1/2


@pytest.mark.parametrize("kwargs, match", [
    ({"silver_f1": 1.5}, "silver_f1 must be in"),
    ({"target_ratio": 0.0}, "target_ratio must be a finite number > 0, got 0.0"),
    ({"adjust": "both"}, "adjust must be one of .*'both'"),
    ({"rebalance": "turn"}, "rebalance must be one of .*'turn'"),
    ({"aggressive_threshold": 0.0}, "aggressive_threshold must be in"),
    ({"silver_from": "top"}, "silver_from must be one of .*'top'"),
    ({"scored_rollouts": "some"}, "scored_rollouts must be one of .*'some'"),
    ({"think_similarity": 1.5}, r"think_similarity must be in \[0, 1\] or None, got 1.5"),
    ({"shared_docs": 0}, "shared_docs must be an integer >= 1 or None, got 0"),
    ({"shared_docs": 1.5}, "shared_docs must be an integer >= 1 or None, got 1.5"),
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
    with pytest.raises(ValueError, match=r"think_sim must be \[B, T\]=\(3, 4\), got shape \(3, 2\)"):
        calibadv_token_advantages(**{**t, "think_sim": t["think_sim"][:, :2]})
    with pytest.raises(ValueError, match="think_similarity=0.5 needs think_sim"):
        calibadv_token_advantages(**{**t, "think_sim": None})
    calibadv_token_advantages(**{**t, "think_sim": None}, config=CalibAdvConfig(think_similarity=None))  # rule off


def test_cli_flags_default_to_the_authors_and_keep_the_earlier_rules(openrlhf_gpu_stubs, capsys):
    from openrlhf_sgrpo.cli.train_ppo_ray import CliError, parse_config
    from openrlhf_sgrpo.openrlhf_ext.calibadv_hook import calibadv_config_from_args

    base = ["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "3", "--algo.calibadv.enable"]
    assert calibadv_config_from_args(parse_config(base)) == CalibAdvConfig()
    earlier = ["--algo.calibadv.silver_from", "all_good", "--algo.calibadv.scored_rollouts", "all",
               "--algo.calibadv.think_similarity", "none", "--algo.calibadv.shared_docs", "none",
               "--algo.calibadv.softpenalty_first", "false"]
    assert calibadv_config_from_args(parse_config(base + earlier)) == CalibAdvConfig(
        silver_from="all_good", scored_rollouts="all", think_similarity=None, shared_docs=None,
        softpenalty_first=False)
    assert calibadv_config_from_args(parse_config(base + ["--algo.calibadv.softpenalty_first"])).softpenalty_first
    with pytest.raises(CliError, match="--algo.calibadv.shared_docs must be an integer >= 1 or None, got 0"):
        parse_config(base + ["--algo.calibadv.shared_docs", "0"])
    with pytest.raises(SystemExit):
        parse_config(base + ["--algo.calibadv.softpenalty_first", "maybe"])
    assert "--algo.calibadv.softpenalty_first: expected true or false, got 'maybe'" in capsys.readouterr().err


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
        meta.update({K.F1: f1[i], K.ANSWERED: 1, K.FORMAT_OK: int(fmt[i]), K.INVALID_ACTIONS: 0,
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
    from openrlhf_sgrpo.openrlhf_ext.turn_info import turn_tensors

    with pytest.raises(KeyError, match="agent_env.openrlhf_agent"):
        turn_tensors({"f1": torch.tensor([1.0])})
    exps = agent_experiences(group_one())
    for key in ("f1", "format_ok", "turn1_think_sim"):
        info = copy.deepcopy(exps[0].info)
        del info[key]
        with pytest.raises(KeyError, match=f"'{key}'"):
            turn_tensors(info)
