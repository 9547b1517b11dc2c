"""The stratified estimators inside OpenRLHF 0.11.2's real experience maker and trainer.

Only the imports of GPU-only modules (vllm, flash_attn) are stubbed; everything called here is
OpenRLHF's own code: RemoteExperienceMaker.compute_advantages_and_returns, Experience,
compute_reward, get_cumulative_returns, FixedKLController, the PPOTrainer module.
"""

from __future__ import annotations

import copy
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from openrlhf_sgrpo.advantages import stratified_advantages
from openrlhf_sgrpo.cli.train_ppo_ray import parse_config

pytestmark = pytest.mark.usefixtures("openrlhf_gpu_stubs")

N = 4  # samples per prompt
PROMPTS = 3
CONFTEST = Path(__file__).with_name("conftest.py")


def make_args(*flags: str):
    """Real OpenRLHF + openrlhf-sgrpo parser, hierarchized, as a Ray worker receives it."""
    return parse_config(["--rollout.n_samples_per_prompt", str(N), *flags])


def make_maker(cls, args, kl_coef=0.0):
    from types import SimpleNamespace

    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    return cls(None, None, None, None, FixedKLController(kl_coef), SimpleNamespace(args=args), tokenizer=None)


def make_experiences(seed=0, micro=2, tool_gap=0):
    """Samples as OpenRLHF's split_rollout_samples leaves them: shuffled, micro-batched, indexed."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    g = torch.Generator().manual_seed(seed)
    total = N * PROMPTS
    rewards = torch.randint(0, 2, (total,), generator=g).float()
    tool_calls = torch.randint(0, 3, (total,), generator=g)
    order = list(range(total))
    random.Random(seed).shuffle(order)
    singles = []
    for i in order:
        length = 6 + i % 3
        mask = torch.zeros(1, length + tool_gap + 3, dtype=torch.bool)
        mask[0, 1:4] = True  # first action turn
        mask[0, 4 + tool_gap:4 + tool_gap + length - 3] = True  # second turn after `tool_gap` tool tokens
        kl = torch.randn(1, mask.shape[1], generator=g) * 0.01
        singles.append(Experience(
            sequences=torch.ones(1, mask.shape[1] + 1, dtype=torch.long),
            action_mask=mask, kl=kl, rewards=rewards[i:i + 1].clone(),
            response_length=torch.tensor([int(mask.nonzero()[-1, 1] - mask.nonzero()[0, 1] + 1)]),
            truncated=torch.tensor([False]), index=[i],
            info={"tool_calls": tool_calls[i:i + 1].clone(), "reward": rewards[i:i + 1].clone()},
        ))
    batches = []
    for k in range(0, total, micro):
        chunk = singles[k:k + micro]
        width = max(e.action_mask.shape[1] for e in chunk)
        pad = lambda t, v=0: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=v)  # noqa: E731
        batches.append(Experience(
            sequences=torch.cat([pad(e.sequences) for e in chunk]),
            action_mask=torch.cat([pad(e.action_mask) for e in chunk]),
            kl=torch.cat([pad(e.kl) for e in chunk]),
            rewards=torch.cat([e.rewards for e in chunk]),
            response_length=torch.cat([e.response_length for e in chunk]),
            truncated=torch.cat([e.truncated for e in chunk]),
            index=[i for e in chunk for i in e.index],
            info={k: torch.cat([e.info[k] for e in chunk]) for k in chunk[0].info},
        ))
    return batches, rewards, tool_calls


def last_action_advantage(experiences):
    """Per-sample advantage at the first action token (equals the return-to-go of the sample)."""
    out = {}
    for e in experiences:
        first = e.action_mask.long().argmax(dim=1)
        for row, idx in enumerate(e.index):
            out[idx] = float(e.advantages[row, first[row]])
    return torch.tensor([out[i] for i in range(len(out))])


def test_peer_check_alpha0_equals_openrlhf_group_norm():
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    exps, _, _ = make_experiences(seed=1)
    upstream = make_maker(RemoteExperienceMaker, make_args("--algo.advantage.estimator", "group_norm"), kl_coef=0.01)
    ours = make_maker(StratifiedExperienceMaker, make_args(
        "--algo.advantage.estimator", "stratified_grpo", "--algo.advantage.sgrpo_alpha", "0",
        "--algo.advantage.sgrpo_std", "unbiased", "--algo.advantage.sgrpo_eps", "1e-9"), kl_coef=0.01)
    want = upstream.compute_advantages_and_returns(copy.deepcopy(exps))
    got = ours.compute_advantages_and_returns(copy.deepcopy(exps))
    for w, g in zip(want, got):
        assert w.index == g.index
        torch.testing.assert_close(g.advantages, w.advantages, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g.returns, w.returns, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g.info["return"], w.info["return"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g.info["group_reward_std"], w.info["group_reward_std"])
        assert g.kl is None and w.kl is None


def test_stratified_advantages_reach_every_action_token_in_prompt_order():
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import ADVANTAGE_INFO_KEY, StratifiedExperienceMaker

    exps, rewards, tool_calls = make_experiences(seed=2, micro=3)
    maker = make_maker(StratifiedExperienceMaker, make_args("--algo.advantage.estimator", "stratified_grpo",
                                                           "--algo.advantage.sgrpo_alpha", "0.6"))
    out = maker.compute_advantages_and_returns(exps)
    want = stratified_advantages(rewards, tool_calls, N, alpha=0.6)
    torch.testing.assert_close(last_action_advantage(out), want.float(), rtol=1e-5, atol=1e-6)
    for e in out:
        # no KL (coef 0): every action token carries the sample's advantage, tool tokens 0
        row_adv = e.info[ADVANTAGE_INFO_KEY]
        expected = row_adv[:, None].float() * e.action_mask
        torch.testing.assert_close(e.advantages * e.action_mask, expected, rtol=1e-5, atol=1e-6)
        assert "sgrpo/between_stratum_term" in e.info and e.info["sgrpo/strata_per_prompt"].shape == (len(e.index),)


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_baseline", "dr_grpo", "reinforce"])
def test_other_estimators_behave_exactly_as_upstream(estimator):
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    exps, _, _ = make_experiences(seed=3)
    args = make_args("--algo.advantage.estimator", estimator)
    want = make_maker(RemoteExperienceMaker, args, 0.01).compute_advantages_and_returns(copy.deepcopy(exps))
    got = make_maker(StratifiedExperienceMaker, args, 0.01).compute_advantages_and_returns(copy.deepcopy(exps))
    for w, g in zip(want, got):
        torch.testing.assert_close(g.advantages, w.advantages)


def test_overlong_penalty_counts_action_tokens_only_issue_1243():
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    # 200 tool tokens sit between the two action turns; actions total 6-8 tokens
    exps, _, _ = make_experiences(seed=4, tool_gap=200)
    flags = ("--algo.advantage.estimator", "group_norm", "--rollout.max_new_tokens", "64",
             "--reward.overlong_buffer_len", "16")
    upstream = make_maker(RemoteExperienceMaker, make_args(*flags)).compute_advantages_and_returns(
        copy.deepcopy(exps))
    ours = make_maker(StratifiedExperienceMaker, make_args(*flags)).compute_advantages_and_returns(
        copy.deepcopy(exps))
    raw = torch.cat([e.info["reward"] for e in exps])
    # upstream penalizes every sample by the full buffer (span > 64); ours penalizes none
    assert torch.all(torch.cat([e.info["reward"] for e in upstream]) == raw - 1.0)
    assert torch.all(torch.cat([e.info["reward"] for e in ours]) == raw)
    # and response_length (logged) is restored, not left rewritten
    for before, after in zip(exps, ours):
        assert torch.equal(before.response_length, after.response_length)


def test_missing_strata_key_names_the_agent():
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    exps, _, _ = make_experiences(seed=5)
    maker = make_maker(StratifiedExperienceMaker, make_args(
        "--algo.advantage.estimator", "stratified_grpo", "--algo.advantage.stratify_by", "search_calls"))
    with pytest.raises(KeyError, match="search_calls.*agent_env.openrlhf_agent.AgentExecutor"):
        maker.compute_advantages_and_returns(exps)


def test_trainer_subclass_builds_our_experience_maker():
    import openrlhf.trainer.ppo_trainer as ppo_trainer

    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker
    from openrlhf_sgrpo.openrlhf_ext.trainer import SGRPOPPOTrainerImpl, use_sgrpo_trainer

    saved = (ppo_trainer.PPOTrainer, ppo_trainer.RemoteExperienceMaker)
    try:
        use_sgrpo_trainer()
        assert ppo_trainer.PPOTrainer.__ray_actor_class__ is SGRPOPPOTrainerImpl
        # BasePPOTrainer.__init__ is what both sync and async trainers run: check what it builds
        base = ppo_trainer.BasePPOTrainer.__new__(ppo_trainer.BasePPOTrainer)
        from types import SimpleNamespace
        args = make_args("--algo.advantage.estimator", "stratified_grpo")
        ppo_trainer.BasePPOTrainer.__init__(base, SimpleNamespace(args=args), None, None, None, None, None, None)
        assert isinstance(base.experience_maker, StratifiedExperienceMaker)
    finally:
        ppo_trainer.PPOTrainer, ppo_trainer.RemoteExperienceMaker = saved


def _fresh_process(code: str) -> str:
    """Run code in a fresh interpreter with the same GPU-import stubs; return its last stdout line
    (DeepSpeed prints an accelerator notice on import)."""
    prelude = textwrap.dedent(f"""
        import importlib.util
        _spec = importlib.util.spec_from_file_location("_stubs", {str(CONFTEST)!r})
        _m = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(_m)
        _m.install_gpu_import_stubs()
    """)
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_fresh_process_unpickling_our_trainer_gets_the_patch():
    """A Ray worker receives the actor class pickled by reference: unpickling imports our module,
    and constructing it installs the patch before OpenRLHF builds the experience maker."""
    import cloudpickle

    from openrlhf_sgrpo.openrlhf_ext.trainer import SGRPOPPOTrainerImpl

    blob = cloudpickle.dumps(SGRPOPPOTrainerImpl)
    assert b"openrlhf_sgrpo.openrlhf_ext.trainer" in blob  # by reference, not by value
    out = _fresh_process(f"""
        import pickle
        import openrlhf.trainer.ppo_trainer as pt
        before = pt.RemoteExperienceMaker.__name__
        cls = pickle.loads({blob!r})
        from openrlhf_sgrpo.openrlhf_ext.patches import install_patches, patches_active
        obj = cls.__new__(cls)
        try:
            cls.__init__(obj, "missing-model", None, None, None, None, None, None)
        except Exception:
            pass  # the tokenizer load fails without a model; the patch ran first
        print(before, pt.RemoteExperienceMaker.__name__, patches_active())
    """)
    assert out.split() == ["RemoteExperienceMaker", "StratifiedExperienceMaker", "True"]


@pytest.mark.slow
def test_ray_worker_setup_hook_patches_real_ray_workers():
    """A real local Ray cluster: workers started with our runtime_env hook see the patched module."""
    out = _fresh_process("""
        import ray
        from openrlhf_sgrpo.openrlhf_ext.patches import WORKER_SETUP_HOOK

        def hook():
            import importlib
            # the driver's stubs do not cross process borders: stub GPU imports here as well
            _spec = importlib.util.spec_from_file_location("_stubs", %r)
            _m = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(_m)
            _m.install_gpu_import_stubs()
            mod, fn = WORKER_SETUP_HOOK.rsplit(".", 1)
            getattr(importlib.import_module(mod), fn)()

        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
                 runtime_env={"worker_process_setup_hook": hook})

        @ray.remote
        def probe():
            import os
            import openrlhf.trainer.ppo_trainer as pt
            return os.getpid(), pt.RemoteExperienceMaker.__name__

        import os
        pid, name = ray.get(probe.remote())
        print(pid != os.getpid(), name)
        ray.shutdown()
    """ % str(CONFTEST))
    assert out.split()[-2:] == ["True", "StratifiedExperienceMaker"]
