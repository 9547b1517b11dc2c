"""The CPU study's update shortcuts compute the update they replace.

- ``shared_prefix`` (local/shared_prefix.py): a prompt group's shared prompt runs once, its keys
  and values expanded to every row: the same log-probs and gradient as the plain pass, to float
  rounding, on both architectures the project trains here (Qwen2, and Llama: SmolLM2's);
- ``skip_zero_advantage``: rows whose token advantages are all 0 get no forward or backward; the
  optimizer step's weights equal the full pass's, including a step where *every* row is skipped
  (AdamW still moves the weights with its momentum: the zero gradient must be there);
- both refuse the settings where they would not be exact, naming them.
The reference is always the runner's own plain path on a copy of the same weights.
"""

from __future__ import annotations

import copy

import pytest
import torch

from openrlhf_sgrpo import assets
from openrlhf_sgrpo.local.data import Question
from openrlhf_sgrpo.local.experience import Batch, collate, tensorize_response
from openrlhf_sgrpo.local.experience_maker import make_experience
from openrlhf_sgrpo.local.loss import LossConfig, action_log_probs
from openrlhf_sgrpo.local.shared_prefix import action_log_probs_shared, shared_prefix_len
from openrlhf_sgrpo.local.trainer import LocalTrainer, TrainConfig, _mean_over_updates
from openrlhf_sgrpo.sapo import SAPOConfig
from openrlhf_sgrpo.testing import shifted_seed

GROUP = 4
PROMPT = 24


@pytest.fixture(scope="module")
def tiny():
    return assets.tiny_qwen2(seed=shifted_seed(0))


def _group_responses(group: int, rewards: list[float], calls: list[int]) -> list[dict]:
    """One prompt's samples: the same ``PROMPT`` tokens, then continuations of their own lengths
    with two action turns each (the first starting right after the prompt)."""
    g = torch.Generator().manual_seed(1000 + group)
    prompt = torch.randint(5, 1000, (PROMPT,), generator=g).tolist()
    out = []
    for k, (r, t) in enumerate(zip(rewards, calls)):
        n = 20 + 7 * k
        tail = torch.randint(5, 1000, (n,), generator=g).tolist()
        ranges = [(PROMPT, PROMPT + 6), (PROMPT + 12, PROMPT + n)]
        out.append({"prompt": f"q{group}", "label": '["a"]', "observation_tokens": prompt + tail,
                    "action_ranges": ranges, "reward": r, "scores": r, "truncated": False, "images": None,
                    "mm_train_inputs": None, "rollout_log_probs": None, "extra_logs": {"tool_calls": t}})
    return out


def _samples(groups: list[tuple[list[float], list[int]]]):
    return [tensorize_response(r, 128) for i, (rw, calls) in enumerate(groups) for r in _group_responses(i, rw, calls)]


MIXED = [([1.0, 0.0, 0.5, 0.0], [1, 1, 2, 0]),  # spread: every row has an advantage
         ([1.0, 1.0, 1.0, 1.0], [1, 2, 1, 1]),  # no spread: all four are skipped
         ([0.0, 1.0, 0.0, 0.0], [2, 2, 1, 1])]  # a singleton stratum: SAN is 0 there, GN is not


def _step(tiny, tmp_path, groups, **cfg):
    """One optimizer step of the runner over a rollout of ``groups``; (the gradient AdamW was given,
    updates, per-sample). The gradient, not the weights after: AdamW's first step is about
    ``lr * sign(g)``, so float noise on a near-zero gradient entry moves that weight by ~lr."""
    model, tok = tiny
    trainer = LocalTrainer(copy.deepcopy(model), tok, None, [Question("q", "q?", ["a"])],
                           TrainConfig(prompts_per_step=len(groups), n_samples=GROUP, lr=1e-3,
                                       seed=shifted_seed(0), **cfg), tmp_path / str(sorted(cfg.items())))
    exp = make_experience(_samples(groups), GROUP, trainer.cfg.adv, trainer.model, trainer.pad_id,
                          trainer.cfg.micro_batch_size, old_from_update=trainer.cfg.single_update)
    given, step = [], trainer.optimizer.step
    trainer.optimizer.step = lambda: (given.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()])),
                                      step())
    updates, per_sample = trainer._ppo_train(exp, step=1)
    return given[0], updates, per_sample


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(a.abs().sum() > 0) and torch.allclose(a, b, atol=1e-6 * float(a.abs().max()), rtol=1e-3)


@pytest.mark.parametrize("spec", ["tiny-qwen2", "smollm2"])
def test_shared_prefix_log_probs_and_gradient_equal_the_plain_pass(spec, tiny):
    from openrlhf_sgrpo.local.models import load_policy

    model = tiny[0] if spec == "tiny-qwen2" else load_policy(spec, "cpu", dtype=torch.float32)[0]
    batch = collate(_samples([MIXED[0]]), pad_id=0)
    assert shared_prefix_len(batch) == PROMPT - 1  # the last prompt position scores the first action token
    grads, logps = [], []
    for fn in (action_log_probs, action_log_probs_shared):
        model.zero_grad(set_to_none=True)
        logp = fn(model, batch)
        (logp * torch.linspace(-1, 1, logp.shape[1])).sum().backward()
        logps.append(logp.detach())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    model.zero_grad(set_to_none=True)
    assert grads[0].abs().sum() > 0 and (logps[0] != 0).sum() == batch.action_mask.sum()
    assert torch.allclose(logps[0], logps[1], atol=2e-5)
    # float32 sums in another order: the error scales with the largest gradient (SmolLM2's is ~100,
    # where 2 of 135M elements missed a fixed atol of 1e-5 by 1e-6 on an AVX-512 BF16 EPYC)
    assert _close(grads[0], grads[1])


def test_shared_prefix_falls_back_where_rows_share_no_prompt(tiny):
    a, b = _group_responses(0, [1.0], [1])[0], _group_responses(1, [1.0], [1])[0]
    batch = collate([tensorize_response(a, 128), tensorize_response(b, 128)], pad_id=0)
    assert shared_prefix_len(batch) == 0
    assert torch.equal(action_log_probs_shared(tiny[0], batch), action_log_probs(tiny[0], batch))
    one = Batch(batch.sequences[:1], batch.attention_mask[:1], batch.action_mask[:1])
    assert torch.equal(action_log_probs_shared(tiny[0], one), action_log_probs(tiny[0], one))


def test_the_shortcuts_take_the_plain_optimizer_step(tiny, tmp_path):
    plain, plain_updates, plain_rows = _step(tiny, tmp_path, MIXED, micro_batch_size=2)
    for cfg in ({"skip_zero_advantage": True, "micro_batch_size": 2},
                {"shared_prefix": True, "micro_batch_size": GROUP},
                {"shared_prefix": True, "skip_zero_advantage": True, "micro_batch_size": 2}):
        grad, updates, rows = _step(tiny, tmp_path, MIXED, **cfg)
        assert _close(grad, plain), cfg
        assert updates[0]["policy_loss"] == pytest.approx(plain_updates[0]["policy_loss"], abs=1e-6)
        for key in ("clip_ratio", "ppo_kl"):
            assert updates[0][key] == pytest.approx(plain_updates[0][key], abs=1e-5), (cfg, key)
        assert [len(r) for r in rows] == [len(r) for r in plain_rows] == [1] * 12
        if cfg.get("skip_zero_advantage"):
            assert updates[0]["zero_advantage_samples_skipped"] == 4  # the group without spread
            assert all(rows[i][0] == {"ratio_mean": 1.0, "log_ratio_max": 0.0} for i in range(4, 8))


def test_a_step_with_every_row_skipped_still_moves_the_weights_as_adamw_does(tiny, tmp_path):
    """A first step with a gradient, then one with no spread at all: the second step has a zero
    gradient, and AdamW's momentum still moves the weights; skipping every row must too."""
    flat = [([1.0, 1.0, 1.0, 1.0], [1, 1, 1, 1])]
    results = []
    for skip in (False, True):
        model, tok = tiny
        trainer = LocalTrainer(copy.deepcopy(model), tok, None, [Question("q", "q?", ["a"])],
                               TrainConfig(prompts_per_step=1, n_samples=GROUP, lr=1e-3, seed=shifted_seed(0),
                                           micro_batch_size=2, skip_zero_advantage=skip),
                               tmp_path / f"flat{skip}")
        for step, groups in ((1, [MIXED[0]]), (2, flat)):
            exp = make_experience(_samples(groups), GROUP, trainer.cfg.adv, trainer.model, trainer.pad_id, 2,
                                  old_from_update=True)
            before = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
            updates, _ = trainer._ppo_train(exp, step=step)
        after = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
        assert not torch.equal(before, after)  # momentum moved them
        results.append((after, updates))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-7)
    assert results[1][1][0]["zero_advantage_samples_skipped"] == GROUP
    # the step's record (what train_step logs) has the full pass's keys and values: the fourth trap
    # seed's GRPO arm died at a step like this one (KeyError: 'log_ratio_max')
    full, skipped = (_mean_over_updates(updates) for _, updates in results)
    assert set(skipped) - {"zero_advantage_samples_skipped"} == set(full)
    assert {k: skipped[k] for k in full if k != "grad_norm"} == pytest.approx({k: v for k, v in full.items() if k != "grad_norm"})


def test_the_shortcuts_refuse_settings_where_they_would_not_be_exact(tiny, tmp_path):
    with pytest.raises(ValueError, match=r"micro_batch_size \(3\) must divide n_samples \(4\)"):
        TrainConfig(prompts_per_step=3, n_samples=4, micro_batch_size=3, shared_prefix=True)
    with pytest.raises(ValueError, match="gradient checkpointing"):
        TrainConfig(n_samples=4, micro_batch_size=2, shared_prefix=True, gradient_checkpointing=True)
    # skipping is exact only with one optimizer step per rollout, no KL and no SAPO: else it is off
    assert TrainConfig(n_samples=4, micro_batch_size=2, skip_zero_advantage=True).skips_exactly
    for cfg in ({"max_epochs": 2}, {"loss": LossConfig(kl_coef=0.1)}, {"loss": LossConfig(sapo=SAPOConfig())}):
        assert not TrainConfig(n_samples=4, micro_batch_size=2, skip_zero_advantage=True, **cfg).skips_exactly
    _, updates, _ = _step(tiny, tmp_path, MIXED, micro_batch_size=2, skip_zero_advantage=True, max_epochs=2)
    assert "zero_advantage_samples_skipped" not in updates[0]
