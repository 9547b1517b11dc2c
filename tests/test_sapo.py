"""SAPO: the exact penalized-token mask and term on hand-made tensors, and the real OpenRLHF actor.

The actor tests run OpenRLHF 0.11.2's own ActorPPOTrainer.__init__ and training_step (patched by
``install_sapo_patch``, as our PolicyModelActor does in its own process); only the GPU imports,
the distributed barrier, the (CUDA-pinned, unused) replay buffer and the DeepSpeed strategy's backward/step calls are replaced by CPU stand-ins, and
the LM is a one-table softmax policy.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from openrlhf_sgrpo.sapo import SAPOConfig, kl_old_to_new, penalized_mask, sapo_loss, sapo_token_penalty

LOG = math.log


def hand_batch():
    # ratios pi_theta/pi_old per token, chosen around the threshold 0.5
    ratios = torch.tensor([[1.0, 0.4, 0.5, 0.2], [0.3, 0.6, 0.1, 0.45]])
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    old = torch.full_like(ratios, -2.0)
    return old + ratios.log(), old, adv, mask, ratios


def test_penalized_mask_is_exact():
    logp, old, adv, mask, _ = hand_batch()
    got = penalized_mask(logp, old, adv, mask, ratio_threshold=0.5)
    # row 0: adv >= 0 everywhere; ratio <= .5 at cols 1, 2 (col 3 is masked out)
    # row 1: adv < 0 at cols 0, 1; cols 2, 3 have adv = 0 (>= 0) and ratios .1, .45
    want = torch.tensor([[False, True, True, False], [False, False, True, True]])
    assert torch.equal(got, want)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_term_value_is_the_hand_computed_token_mean(estimator):
    logp, old, adv, mask, _ = hand_batch()
    cfg = SAPOConfig(coef=0.5, ratio_threshold=0.5, estimator=estimator)
    kl = {"k1": lambda r: -LOG(r), "k3": lambda r: r - 1 - LOG(r)}[estimator]
    want = 0.5 * (kl(0.4) + kl(0.5) + kl(0.1) + kl(0.45)) / 7  # 7 action tokens
    term, stats = sapo_loss(logp, old, adv, mask, cfg)
    assert float(term) == pytest.approx(want, rel=1e-5)
    assert float(stats.penalized_share) == pytest.approx(4 / 7)
    assert float(stats.mean_ratio) == pytest.approx((1 + .4 + .5 + .3 + .6 + .1 + .45) / 7, rel=1e-6)
    assert float(stats.term) == pytest.approx(want, rel=1e-5)
    # an explicit (global) token count replaces the batch count, as in gradient accumulation
    term14, _ = sapo_loss(logp, old, adv, mask, cfg, num_tokens=14)
    assert float(term14) == pytest.approx(want * 7 / 14, rel=1e-5)


def test_k3_is_the_kl_of_two_known_distributions_in_expectation():
    # Tokens sampled from pi_old: E_old[k3] = E_old[k1] = KL(pi_old || pi_theta) exactly.
    p_old = torch.tensor([0.5, 0.3, 0.2])
    p_new = torch.tensor([0.2, 0.5, 0.3])
    exact = float((p_old * (p_old / p_new).log()).sum())
    for est in ("k1", "k3"):
        per_token = kl_old_to_new(p_new.log(), p_old.log(), est)
        assert float((p_old * per_token).sum()) == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_term_is_zero_when_policy_equals_old_policy(estimator):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g) * 3
    logp = old.clone().requires_grad_(True)
    adv = torch.randn(3, 5, generator=g)
    # even a threshold above 1 (every positive token penalized) gives a zero term at r = 1
    term, stats = sapo_loss(logp, old, adv, torch.ones(3, 5, dtype=torch.bool),
                            SAPOConfig(coef=2.0, ratio_threshold=1.5, estimator=estimator))
    assert float(term.detach()) == 0.0 and float(stats.mean_ratio) == pytest.approx(1.0)
    term.backward()
    if estimator == "k3":  # k3's gradient (r - 1) * grad log pi also vanishes at r = 1
        assert torch.count_nonzero(logp.grad) == 0


def test_gradient_pulls_penalized_tokens_back_up():
    logp, old, adv, mask, _ = hand_batch()
    logp = logp.clone().requires_grad_(True)
    per_token, pen = sapo_token_penalty(logp, old, adv, mask, SAPOConfig(1.0, 0.5, "k3"))
    per_token.sum().backward()
    assert torch.all(logp.grad[pen] < 0)  # descent raises log pi_theta on penalized tokens
    assert torch.all(logp.grad[~pen] == 0)


@pytest.mark.parametrize("kwargs, match", [
    ({"coef": -1.0}, "coef must be a finite number >= 0, got -1.0"),
    ({"ratio_threshold": 0.0}, "ratio_threshold must be a finite number > 0, got 0.0"),
    ({"estimator": "k2"}, "estimator must be one of .*'k2'"),
])
def test_bad_config_names_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SAPOConfig(**kwargs)


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match=r"advantages shape \(2, 3\) != log_probs shape \(2, 4\)"):
        sapo_token_penalty(torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(2, 3), None, SAPOConfig())


# ------------------------------------------------------------------ the real OpenRLHF actor

VOCAB = 5


class TablePolicy(torch.nn.Module):
    """A context-free softmax over VOCAB tokens with Actor.forward's call signature."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(VOCAB))

    def forward(self, sequences, action_mask, attention_mask=None, return_output=False, **_):
        logp = torch.log_softmax(self.logits, -1)[sequences[:, 1:]]
        return logp, SimpleNamespace()


def make_trainer(monkeypatch, *flags):
    from openrlhf.trainer.ray import ppo_actor

    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config
    from openrlhf_sgrpo.openrlhf_ext.sapo_actor import install_sapo_patch

    install_sapo_patch()
    monkeypatch.setattr(ppo_actor, "torch_dist_barrier_and_cuda_sync", lambda: None)  # no process group on CPU
    monkeypatch.setattr(ppo_actor, "NaiveReplayBuffer", lambda *a, **k: None)  # pins to cuda:N; unused here
    args = parse_config(["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2", *flags])
    losses = []
    actor = TablePolicy()
    optim = torch.optim.SGD(actor.parameters(), lr=0.0)
    strategy = SimpleNamespace(
        args=args, ring_attn_group=None,
        backward=lambda loss, model, opt: (losses.append(loss.detach()), loss.backward()),
        optimizer_step=lambda *a, **k: None, get_grad_norm=lambda model: 0.0,
        all_reduce=lambda x: x, is_rank_0=lambda: True)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 1.0)
    trainer = ppo_actor.ActorPPOTrainer(strategy, actor, None, optim, sched, micro_train_batch_size=2)
    return trainer, actor, losses


def make_experience(actor, ratios, adv):
    from openrlhf.trainer.ppo_utils.experience import Experience

    seq = torch.tensor([[0, 1, 2, 3, 4], [0, 4, 3, 2, 1]])
    mask = torch.ones(2, 4, dtype=torch.bool)
    with torch.no_grad():
        logp, _ = actor(seq, mask)
    return Experience(sequences=seq, action_mask=mask, attention_mask=torch.ones_like(seq, dtype=torch.bool),
                      action_log_probs=logp - ratios.log(), base_action_log_probs=logp - ratios.log(),
                      advantages=adv, rewards=torch.zeros(2), index=[0, 1], info={})


def test_actor_without_flags_keeps_openrlhf_loss_and_adds_no_stats(openrlhf_gpu_stubs, monkeypatch):
    from openrlhf.models import PolicyLoss

    trainer, actor, _ = make_trainer(monkeypatch)
    assert type(trainer.actor_loss_fn) is PolicyLoss
    status = trainer.training_step(make_experience(actor, torch.full((2, 4), 0.3), torch.ones(2, 4)), 0.0, 0)
    assert not any(k.startswith("sapo/") for k in status["metrics"])


def test_actor_with_sapo_adds_the_term_and_logs_it(openrlhf_gpu_stubs, monkeypatch):
    from openrlhf.models import PolicyLoss

    from openrlhf_sgrpo.openrlhf_ext.sapo_actor import SAPOPolicyLoss

    trainer, actor, losses = make_trainer(monkeypatch, "--algo.sapo.enable", "--algo.sapo.coef", "0.5",
                                          "--algo.sapo.ratio_threshold", "0.5", "--algo.sapo.estimator", "k3")
    assert isinstance(trainer.actor_loss_fn, SAPOPolicyLoss)
    assert trainer.actor_loss_fn.clip_eps_low == pytest.approx(0.2)  # wrapped loss settings still visible
    ratios = torch.tensor([[1.0, 0.4, 0.5, 0.2], [0.3, 0.6, 0.1, 0.45]])
    adv = torch.tensor([[1.0] * 4, [-1.0, -1.0, 0.0, 0.0]])
    exp = make_experience(actor, ratios, adv)
    with torch.no_grad():
        logp = actor(exp.sequences, exp.action_mask)[0]
    base = PolicyLoss()(logp, exp.action_log_probs, adv, action_mask=exp.action_mask)[0]
    status = trainer.training_step(exp, 0.0, 0)
    k3 = lambda r: r - 1 - LOG(r)
    term = 0.5 * (k3(0.4) + k3(0.5) + k3(0.2) + k3(0.1) + k3(0.45)) / 8
    assert float(losses[0]) == pytest.approx(float(base) + term, rel=1e-5)
    m, w = status["metrics"], status["weights"]
    assert float(m["sapo/term"]) == pytest.approx(term, rel=1e-5)
    assert float(m["sapo/penalized_share"]) == pytest.approx(5 / 8)
    assert float(m["sapo/mean_ratio"]) == pytest.approx(float(ratios.mean()), rel=1e-5)
    assert m["sapo/term"].dim() == 0 and w["sapo/term"] == "token"
    # the SAPO gradient reaches the policy parameters
    assert actor.logits.grad is not None and torch.count_nonzero(actor.logits.grad) > 0
