"""Fast checks of the local runner's pieces against OpenRLHF's own code (no model, no servers)."""

from __future__ import annotations

import copy
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from openrlhf.utils.loss_utils import iter_grad_accum_global_norm

from agent_env import info_keys as K
from agent_env import metadata as M
from openrlhf_sgrpo import assets
from openrlhf_sgrpo.advantages import compute_stratified
from openrlhf_sgrpo.calibadv import CalibAdvConfig
from openrlhf_sgrpo.local import upstream
from openrlhf_sgrpo.local.checkpoint import (
    checkpoint_dirs,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from openrlhf_sgrpo.local.data import Question
from openrlhf_sgrpo.local.experience import collate, info_tensor, tensorize_response
from openrlhf_sgrpo.local.experience_maker import (
    AdvantageConfig,
    cumulative_returns,
    make_experience,
    sample_advantages,
    token_advantages,
)
from openrlhf_sgrpo.local.loss import LossConfig, PolicyObjective, action_log_probs
from openrlhf_sgrpo.local.timing import uncovered_length, union_length
from openrlhf_sgrpo.local.trainer import LocalTrainer, TrainConfig
from openrlhf_sgrpo.sapo import SAPOConfig
from openrlhf_sgrpo.testing import install_gpu_import_stubs, shifted_seed


def _response(seed: int = 0, n_tokens: int = 30, ranges=((10, 14), (20, 25)), logprobs=True) -> dict:
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, 1000, (n_tokens,), generator=g).tolist()
    return {"prompt": "q", "label": '["a"]', "observation_tokens": toks, "action_ranges": list(ranges),
            "reward": 0.5, "scores": 1.0, "truncated": False, "images": None, "mm_train_inputs": None,
            "rollout_log_probs": [float(i) / 10 for i in range(n_tokens)] if logprobs else None,
            "extra_logs": {"tool_calls": 1, "em": 1.0, "turn0_start": 10, K.turn_doc_key(0, 0): BIG_DOC_ID}}


BIG_DOC_ID = M.encode_doc_id("wiki-18 passage 20999999")  # 63 bits: float64 would round it


def test_policy_loss_is_openrlhfs_own_file_and_no_gpu_module_is_imported():
    cls = PolicyObjective(LossConfig()).policy_loss.__class__
    path = Path(inspect.getsourcefile(cls)).resolve()
    assert path == (upstream.openrlhf_models_dir() / "loss.py").resolve()
    assert cls.__name__ == "PolicyLoss" and "site-packages/openrlhf/models" in str(path)
    # Other tests in this process stub the vllm/flash_attn imports, so the runner's import
    # hygiene is checked in a fresh interpreter: building the objective loads no GPU module.
    probe = (
        "import sys\n"
        "from openrlhf_sgrpo.local.loss import LossConfig, PolicyObjective\n"
        "PolicyObjective(LossConfig())\n"
        "print(sorted(m for m in ('flash_attn', 'vllm', 'openrlhf.models') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def _upstream_process_response():
    """OpenRLHF's own SamplesGenerator method, imported from the installed package (only the GPU-only
    vllm / flash_attn imports are stubbed, by the shared test stubs)."""
    install_gpu_import_stubs()
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    return SamplesGenerator._process_response_into_experience


@pytest.mark.parametrize("max_len, logprobs", [(64, True), (22, True), (64, False), (12, True)])
def test_tensorize_matches_upstream_experience(monkeypatch, max_len, logprobs):
    upstream_fn = _upstream_process_response()
    resp = _response(logprobs=logprobs)
    exp = upstream_fn(None, resp, max_len=max_len)
    ours = tensorize_response(resp, max_len)
    assert torch.equal(exp.sequences[0], ours.sequences)
    assert torch.equal(exp.attention_mask[0], ours.attention_mask)
    assert torch.equal(exp.action_mask[0], ours.action_mask)
    if logprobs:
        assert torch.equal(exp.rollout_log_probs[0], ours.rollout_log_probs)
    else:
        assert exp.rollout_log_probs is None and ours.rollout_log_probs is None
    assert int(exp.response_length[0]) == ours.response_length
    assert float(exp.total_length[0]) == ours.total_length
    assert bool(exp.info["response_clip_ratio"][0]) == ours.is_clipped
    assert float(exp.rewards[0]) == ours.reward and float(exp.scores[0]) == ours.score
    for key, value in resp["extra_logs"].items():  # upstream keeps ints as int64: so do we
        assert exp.info[key][0].item() == ours.info[key] and type(exp.info[key][0].item()) is type(ours.info[key])
    doc = K.turn_doc_key(0, 0)
    assert info_tensor([ours, ours], doc).tolist() == [BIG_DOC_ID] * 2 and BIG_DOC_ID > 2**53
    assert int(float(BIG_DOC_ID)) != BIG_DOC_ID  # the id this checks is one float64 would change


def test_collate_right_pads_and_keeps_masks():
    a, b = tensorize_response(_response(0, 30), 64), tensorize_response(_response(1, 18, ((5, 9),)), 64)
    batch = collate([a, b], pad_id=7)
    assert batch.sequences.shape == (2, 30) and batch.action_mask.shape == (2, 29)
    assert torch.equal(batch.sequences[1, 18:], torch.full((12,), 7))
    assert batch.attention_mask[1].sum() == 18 and batch.num_action_tokens == int(a.action_mask.sum() + b.action_mask.sum())


def test_cumulative_returns_match_the_reference_loop():
    g = torch.Generator().manual_seed(0)
    rewards, mask = torch.randn(3, 9, generator=g), (torch.rand(3, 9, generator=g) > 0.3).float()
    for gamma in (1.0, 0.9):
        ref = torch.zeros_like(rewards)
        run = torch.zeros(3)
        for t in reversed(range(9)):
            run = rewards[:, t] * mask[:, t] + gamma * run
            ref[:, t] = run
        assert torch.allclose(cumulative_returns(rewards, mask, gamma), ref, atol=1e-6)


def test_token_advantages_put_the_advantage_on_every_action_token_before_the_last():
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 0, 0, 0]])
    adv = torch.tensor([0.7, -1.5])
    out = token_advantages(adv, mask)
    assert torch.allclose(out[0, :6], torch.full((6,), 0.7)) and out[0, 6] == 0
    assert torch.allclose(out[1, :2], torch.full((2,), -1.5)) and (out[1, 2:] == 0).all()
    kl = torch.ones(2, 7)
    with_kl = token_advantages(adv, mask, kl=kl, kl_coef=0.1)
    assert with_kl[0, 5] == pytest.approx(0.7 - 0.1) and with_kl[0, 1] == pytest.approx(0.7 - 0.3)


def _samples(rewards, tool_calls):
    out = []
    for i, (r, t) in enumerate(zip(rewards, tool_calls)):
        s = tensorize_response({**_response(i), "reward": r, "extra_logs": {"tool_calls": t}}, 64)
        out.append(s)
    return out


def test_sample_advantages_use_the_shared_estimator_and_monitors():
    rewards, calls = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0], [0, 0, 1, 1, 2, 2, 2, 0]
    res = sample_advantages(_samples(rewards, calls), 4, AdvantageConfig(alpha=0.6))
    ref = compute_stratified("stratified_grpo", torch.tensor(rewards), torch.tensor(calls), 4, 0.6)
    assert torch.allclose(res.advantages, ref.float())
    assert res.metrics["sgrpo/strata_per_prompt"] == 2.0 and "sgrpo/in_stratum_var_adv" in res.metrics
    assert torch.allclose(0.6 * res.san + 0.4 * res.gn, res.advantages)  # the blend's parts, per sample
    grpo = sample_advantages(_samples(rewards, calls), 4, AdvantageConfig(estimator="grpo"))
    assert torch.allclose(grpo.advantages, compute_stratified("stratified_grpo", torch.tensor(rewards),
                                                              torch.tensor(calls), 4, 0.0).float())
    with pytest.raises(ValueError, match="estimator must be one of"):
        AdvantageConfig(estimator="ppo")
    with pytest.raises(KeyError, match="no info key 'search_calls'"):
        sample_advantages(_samples(rewards, calls), 4, AdvantageConfig(stratify_by="search_calls"))


def test_accumulated_micro_batches_give_the_mini_batch_token_mean_and_sapo_kl_terms():
    """OpenRLHF's iter_grad_accum_global_norm normalizes every micro-batch by the window's tokens
    (divided by gas); with DeepSpeed's 1/gas scaling, the micro losses add up to one token mean."""
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 6, generator=g) - 2
    old = logp + 0.3 * torch.randn(4, 6, generator=g)
    adv, mask = torch.randn(4, 6, generator=g), (torch.rand(4, 6, generator=g) > 0.3).float()
    obj = PolicyObjective(LossConfig())
    full, _ = obj(logp, old, adv, mask, {"batch_num_tokens": float(mask.sum())})
    parts = list(iter_grad_accum_global_norm([slice(0, 2), slice(2, 4)], None, 2, lambda sl: mask[sl]))
    assert float(parts[0][1]["batch_num_tokens"]) == float(mask.sum()) / 2
    accumulated = sum(obj(logp[sl], old[sl], adv[sl], mask[sl], info)[0] / 2 for sl, info in parts)
    assert torch.allclose(full, accumulated, atol=1e-6)
    info = {"batch_num_tokens": float(mask.sum())}
    sapo, stats = PolicyObjective(LossConfig(sapo=SAPOConfig(coef=1.0, ratio_threshold=2.0)))(logp, old, adv, mask, info)
    assert "sapo/term" in stats and float(sapo) != float(full)
    with pytest.raises(ValueError, match="ref_log_probs"):
        PolicyObjective(LossConfig(kl_coef=0.1))(logp, old, adv, mask, info)
    kl_loss, kl_stats = PolicyObjective(LossConfig(kl_coef=0.1))(logp, old, adv, mask, info, ref_log_probs=old)
    assert kl_stats["kl"] > 0 and float(kl_loss) > float(full)


@pytest.fixture(scope="module")
def tiny():
    return assets.tiny_qwen2(seed=shifted_seed(0))


def test_log_probs_are_computed_at_action_columns_only_and_match_a_full_forward(tiny):
    model, _ = tiny
    samples = [tensorize_response(_response(i, n_tokens=30 - 6 * i, ranges=((4, 9), (14, 18 - i))), 64)
               for i in range(2)]
    batch = collate(samples, pad_id=0)
    got = action_log_probs(model, batch)
    with torch.no_grad():
        logits = model(input_ids=batch.sequences, attention_mask=batch.attention_mask,
                       position_ids=(batch.attention_mask.cumsum(-1) - 1).clamp(min=0)).logits[:, :-1]
        ref = torch.log_softmax(logits.float(), -1).gather(2, batch.sequences[:, 1:].unsqueeze(-1)).squeeze(-1)
    mask = batch.action_mask.bool()
    assert torch.allclose(got[mask], ref[mask], atol=1e-5)
    assert (got[~mask] == 0).all()


def _agent_sample(i: int, reward: float, searched: bool, f1: float) -> dict:
    """An executor response with the agent's turn slots filled: a search turn (doc i % 3) then an answer."""
    ranges = [(10, 14), (20, 25)] if searched else [(10, 16)]
    meta = M.empty_metadata(2, 3)
    meta.update({K.TOOL_CALLS: int(searched), K.SEARCH_CALLS: int(searched), K.ANSWERED: 1, K.F1: f1, K.EM: f1})
    kinds = ["search", "answer"] if searched else ["answer"]
    for k, kind in enumerate(kinds):
        meta[K.turn_kind_key(k)] = K.KIND_CODES[kind]
    if searched:
        meta[K.turn_doc_key(0, 0)] = M.encode_doc_id(str(i % 3))
    meta = M.fill_action_ranges(meta, ranges, 2, 64)
    return {**_response(i, ranges=ranges, logprobs=False), "reward": reward, "extra_logs": meta}


def test_calibadv_runs_on_whole_groups_whatever_the_micro_batch(tiny):
    """The demo crashed when CalibAdv ran per micro-batch (2 rows, group of 4): it now runs once
    on the whole rollout, so the micro-batch size only changes how log-probs are batched."""
    model, _ = tiny
    rows = [(1.0, True, 1.0), (0.0, True, 0.0), (0.1, False, 0.0), (1.0, False, 1.0),
            (0.0, True, 0.0), (1.0, True, 1.0), (0.0, False, 0.0), (0.1, True, 0.0)]
    samples = [tensorize_response(_agent_sample(i, *row), 64) for i, row in enumerate(rows)]
    cfg = AdvantageConfig(calibadv=CalibAdvConfig())
    exp2 = make_experience(samples, 4, cfg, model, pad_id=0, micro_batch_size=2)
    exp8 = make_experience(samples, 4, cfg, model, pad_id=0, micro_batch_size=8)
    assert exp2.calibadv_stats and exp2.calibadv_stats == exp8.calibadv_stats
    for a, b, o2, o8 in zip(exp2.token_advantages, exp8.token_advantages, exp2.old_log_probs, exp8.old_log_probs):
        assert torch.equal(a, b) and torch.allclose(o2, o8, atol=1e-5)
    assert any(not torch.equal(a, r) for a, r in zip(exp2.token_advantages, exp2.returns))  # calibrated


def _trainer(tiny, tmp_path, **cfg) -> LocalTrainer:
    model, tok = tiny
    model = copy.deepcopy(model)
    tcfg = TrainConfig(prompts_per_step=2, n_samples=4, lr=1e-3, seed=shifted_seed(0), **cfg)
    return LocalTrainer(model, tok, None, [Question("q", "q?", ["a"])], tcfg, tmp_path)


def _experience(trainer: LocalTrainer):
    rewards, calls = [1.0, 0.0, 0.5, 0.0, 0.2, 1.0, 0.0, 0.7], [0, 0, 1, 1, 0, 1, 1, 0]
    samples = _samples(rewards, calls)
    return make_experience(samples, 4, trainer.cfg.adv, trainer.model, trainer.pad_id, trainer.cfg.micro_batch_size)


def test_ppo_train_takes_mini_batch_steps_over_epochs_and_the_ratio_leaves_one(tiny, tmp_path):
    """Old log-probs are computed once, so the first optimizer step sees ratio 1 (up to float
    noise between batchings) and every later one the ratio to the policy that sampled."""
    trainer = _trainer(tiny, tmp_path, micro_batch_size=2, train_batch_size=4, max_epochs=2,
                       loss=LossConfig(sapo=SAPOConfig()))
    exp = _experience(trainer)
    updates, per_sample = trainer._ppo_train(exp, step=1)
    assert len(updates) == trainer.cfg.optimizer_steps_per_rollout == 4
    assert updates[0]["log_ratio_max"] < 1e-4
    assert all(u["log_ratio_max"] > 1e-3 for u in updates[1:])
    assert all("sapo/mean_ratio" in u and u["tokens"] > 0 for u in updates)
    assert [len(p) for p in per_sample] == [2] * 8  # every sample once per epoch
    assert all("sapo_penalized_share" in entry for p in per_sample for entry in p)


def test_gradient_accumulation_over_micro_batches_matches_one_big_batch(tiny, tmp_path):
    grads = []
    for micro in (2, 8):
        trainer = _trainer(tiny, tmp_path / str(micro), micro_batch_size=micro)
        exp = _experience(trainer)
        items = [trainer._micro_batch(exp, list(range(lo, lo + micro))) for lo in range(0, 8, micro)]
        gas = 8 // micro
        for item, info in iter_grad_accum_global_norm(items, None, gas, lambda it: it.batch.action_mask):
            trainer._backward(item, info, gas, [[] for _ in range(8)])
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_warm_up_micro_batches_give_the_whole_batchs_gradient(tiny):
    """The warm-up's rows one at a time (each cut to its own length) accumulate the gradient of
    the whole right-padded batch's token mean: only the memory held at once changes."""
    from openrlhf_sgrpo.local.warmup import _batch, backward_action_nll, micro_batches

    model, tok = tiny
    pairs = [("who wrote it", " <answer> Shakespeare </answer>"),
             ("the capital", " <search> capital </search>"),
             ("a much longer question about a river in a country far away", " <answer> Nile </answer>")]
    batch = _batch(tok, pairs, pad_id=0)
    chunks = micro_batches(batch, 1)
    assert [c.sequences.shape[1] for c in chunks] == [int(n) for n in batch.attention_mask.sum(dim=1)]
    assert sum(c.num_action_tokens for c in chunks) == batch.num_action_tokens
    grads, losses = [], []
    for micro in (None, 1, 2):
        model.zero_grad(set_to_none=True)
        losses.append(backward_action_nll(model, batch, micro))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    model.zero_grad(set_to_none=True)
    assert grads[0].abs().sum() > 0
    for g, loss in zip(grads[1:], losses[1:]):
        assert loss == pytest.approx(losses[0], rel=1e-5)
        assert torch.allclose(g, grads[0], atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match="micro_batch_size must be >= 1, got 0"):
        micro_batches(batch, 0)


def test_one_update_per_rollout_scores_with_its_own_forward_as_the_separate_old_pass_would(tiny, tmp_path):
    """One optimizer step over the whole rollout: the old log-probs are the update's own (detached),
    so make_experience runs no forward of its own, and the loss and gradient are those the
    separate no-grad pass gives (up to float noise between two forwards)."""
    results = []
    for from_update in (False, True):
        trainer = _trainer(tiny, tmp_path / str(from_update), micro_batch_size=2)
        assert trainer.cfg.single_update
        forwards = []
        hook = trainer.model.register_forward_hook(lambda *_: forwards.append(1))
        samples = _samples([1.0, 0.0, 0.5, 0.0, 0.2, 1.0, 0.0, 0.7], [0, 0, 1, 1, 0, 1, 1, 0])
        exp = make_experience(samples, 4, trainer.cfg.adv, trainer.model, trainer.pad_id, 2,
                              old_from_update=from_update)
        hook.remove()
        assert (exp.old_log_probs is None) == from_update
        items = [trainer._micro_batch(exp, list(range(lo, lo + 2))) for lo in range(0, 8, 2)]
        stats = [trainer._backward(item, info, 4, [[] for _ in range(8)])
                 for item, info in iter_grad_accum_global_norm(items, None, 4, lambda it: it.batch.action_mask)]
        grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        results.append((len(forwards), sum(x["policy_loss"] for x in stats), grad,
                        max(x["log_ratio_max"] for x in stats)))
    (passes, loss, grad, lr_max), (passes_u, loss_u, grad_u, lr_max_u) = results
    assert passes == 4 and passes_u == 0  # 8 samples in micro-batches of 2, or no pass at all
    assert grad.abs().sum() > 0
    assert abs(loss - loss_u) < 1e-5 and torch.allclose(grad, grad_u, atol=1e-6, rtol=1e-4)
    assert lr_max < 1e-4 and lr_max_u == 0.0  # the ratio is 1: up to float noise, or exactly


def test_several_updates_per_rollout_keep_the_separate_old_pass(tiny, tmp_path):
    for cfg in ({"train_batch_size": 4}, {"max_epochs": 2}):
        trainer = _trainer(tiny, tmp_path, micro_batch_size=2, **cfg)
        assert not trainer.cfg.single_update and trainer.cfg.optimizer_steps_per_rollout == 2


def test_train_config_names_bad_batch_sizes():
    with pytest.raises(ValueError, match="train_batch_size must divide the rollout batch"):
        TrainConfig(prompts_per_step=2, n_samples=4, train_batch_size=3)
    with pytest.raises(ValueError, match="micro_batch_size .4. must divide the train batch size .2."):
        TrainConfig(prompts_per_step=2, n_samples=4, train_batch_size=2, micro_batch_size=4)
    with pytest.raises(ValueError, match="max_epochs must be >= 1"):
        TrainConfig(max_epochs=0)


def test_checkpoint_roundtrip_keeps_newest(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, opt, {"cursor": step * 10}, keep=2)
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["step_2", "step_3"]
    model2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    state = load_checkpoint(latest_checkpoint(tmp_path), model2, opt2)
    assert state["step"] == 3 and state["cursor"] == 30
    assert torch.equal(model.weight, model2.weight)
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    (tmp_path / ".step_4.tmp").mkdir()  # an interrupted save is not a checkpoint
    assert latest_checkpoint(tmp_path).name == "step_3"
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        load_checkpoint(tmp_path / ".step_4.tmp", model2, opt2)


def test_interval_union_and_uncovered_time():
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert union_length([]) == 0
    assert uncovered_length([(0, 4)], [(1, 2), (3, 5)]) == pytest.approx(2)
    assert uncovered_length([(1, 2)], [(0, 3)]) == 0


@pytest.mark.parametrize("mid_update", [False, True])
def test_ctrl_c_saves_only_weights_that_belong_to_a_completed_step(tiny, tmp_path, mid_update):
    trainer = _trainer(tiny, tmp_path, train_batch_size=4)

    def interrupted():
        trainer._mid_update = mid_update  # as if 0 or 1 of the step's two optimizer steps had run
        raise KeyboardInterrupt

    trainer.train_step = interrupted
    with pytest.raises(KeyboardInterrupt):
        trainer.train(progress=False)
    assert (latest_checkpoint(tmp_path / "checkpoints") is None) == mid_update
