"""The stratified estimators inside OpenRLHF 0.11.2's real experience maker and trainer.

Only the imports of GPU-only modules (vllm, flash_attn) are stubbed; everything called here is
OpenRLHF's own code: RemoteExperienceMaker.compute_advantages_and_returns, Experience,
compute_reward, get_cumulative_returns, FixedKLController, the PPOTrainer module.
"""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys

import pytest
import torch

from openrlhf_sgrpo.advantages import stratified_advantages
from openrlhf_sgrpo.cli.train_ppo_ray import parse_config

pytestmark = pytest.mark.usefixtures("openrlhf_gpu_stubs")

N = 4  # samples per prompt
PROMPTS = 3


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
        pad = lambda t, v=0: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=v)
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


@pytest.mark.parametrize("ours, upstream_name, extra", [
    ("stratified_reinforce", "reinforce_baseline", ()),
    ("stratified_reinforce", "reinforce_baseline", ("--algo.advantage.no_std_norm",)),
    ("stratified_rloo", "rloo", ()),
])
def test_peer_check_alpha0_equals_upstream_estimator(ours, upstream_name, extra):
    """At alpha=0 each stratified estimator is its upstream twin, batch whitening included."""
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    exps, _, _ = make_experiences(seed=6)
    upstream = make_maker(RemoteExperienceMaker, make_args("--algo.advantage.estimator", upstream_name, *extra), 0.01)
    mine = make_maker(StratifiedExperienceMaker, make_args("--algo.advantage.estimator", ours,
                                                           "--algo.advantage.sgrpo_alpha", "0", *extra), 0.01)
    want = upstream.compute_advantages_and_returns(copy.deepcopy(exps))
    got = mine.compute_advantages_and_returns(copy.deepcopy(exps))
    for w, g in zip(want, got):
        torch.testing.assert_close(g.advantages, w.advantages, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g.returns, w.returns, rtol=1e-5, atol=1e-6)
    if ours == "stratified_reinforce" and not extra:  # whitened: zero mean, unit std over action tokens
        adv = torch.cat([g.advantages[g.action_mask] for g in got])
        assert abs(float(adv.mean())) < 1e-5 and abs(float(adv.std(unbiased=False)) - 1) < 1e-4


def test_agent_turn_slots_leave_info_after_advantages_counters_stay():
    """OpenRLHF logs (and all-reduces) every info tensor: per-turn slots must not reach it."""
    from agent_env import info_keys as K
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    exps, _, _ = make_experiences(seed=7)
    slots = [K.turn_kind_key(0), K.turn_start_key(0), K.turn_end_key(4), K.turn_doc_key(2, 1)]
    for e in exps:
        for key in slots + [K.SEARCH_CALLS, K.EM]:
            e.info[key] = torch.zeros(len(e.index))
    for estimator in ("stratified_grpo", "group_norm"):
        maker = make_maker(StratifiedExperienceMaker, make_args("--algo.advantage.estimator", estimator))
        out = maker.compute_advantages_and_returns(copy.deepcopy(exps))
        for e in out:
            assert not any(K.is_turn_slot_key(k) for k in e.info), sorted(e.info)
            assert {K.TOOL_CALLS, K.SEARCH_CALLS, K.EM, "sgrpo/strata_per_prompt"} <= set(e.info)


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


def test_trainers_build_our_experience_maker_with_upstreams_arguments():
    """What the sync trainer and the async training actor add to BasePPOTrainer.__init__."""
    from types import SimpleNamespace

    from openrlhf.trainer import ppo_trainer

    from openrlhf_sgrpo.openrlhf_ext.actors import (
        SGRPOPPOTrainerImpl,
        SGRPOTrainingActorImpl,
        _StratifiedMakerMixin,
    )
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    assert _StratifiedMakerMixin in SGRPOPPOTrainerImpl.__mro__ and _StratifiedMakerMixin in SGRPOTrainingActorImpl.__mro__

    class Base(_StratifiedMakerMixin, ppo_trainer.BasePPOTrainer):
        pass

    args = make_args("--algo.advantage.estimator", "stratified_grpo")
    groups = [object() for _ in range(4)]
    trainer = Base(SimpleNamespace(args=args), *groups, None, "tokenizer")
    maker = trainer.experience_maker
    assert type(maker) is StratifiedExperienceMaker
    assert (maker.actor_model_group, maker.critic_model_group, maker.reward_model_group,
            maker.initial_model_group) == tuple(groups)
    assert maker.kl_ctl is trainer.kl_ctl and maker.tokenizer == "tokenizer" and maker.args is args


def test_driver_replaces_exactly_the_classes_train_looks_up():
    import importlib

    from openrlhf_sgrpo.openrlhf_ext import actors

    saved = {key: getattr(importlib.import_module(key[0]), key[1]) for key in actors.DRIVER_REPLACEMENTS}
    try:
        actors.install_actor_classes()
        for (module, name), cls in actors.DRIVER_REPLACEMENTS.items():
            assert getattr(importlib.import_module(module), name) is cls
            # same default resources as upstream's class (num_gpus=1 for the policy actor)
            assert cls._default_options == saved[(module, name)]._default_options
    finally:
        for (module, name), cls in saved.items():
            setattr(importlib.import_module(module), name, cls)


def test_installed_openrlhf_matches_the_upstream_contract():
    from openrlhf_sgrpo.cli.train_ppo_ray import _upstream_main_block
    from openrlhf_sgrpo.openrlhf_ext.upstream_contract import contract_violations, main_block_violations

    assert contract_violations() == []
    assert main_block_violations(_upstream_main_block()) == []


def test_contract_violations_name_what_broke():
    import types

    from openrlhf_sgrpo.openrlhf_ext.upstream_contract import (
        UpstreamName,
        contract_violations,
        main_block_violations,
    )

    broken = (UpstreamName("openrlhf.trainer.ppo_trainer", "NoSuchTrainer", why="renamed upstream"),
              UpstreamName("openrlhf.trainer.ppo_trainer", "BasePPOTrainer.__init__", ("PolicyModelActor",)))
    problems = contract_violations(broken)
    assert len(problems) == 2
    assert "openrlhf.trainer.ppo_trainer.NoSuchTrainer is missing" in problems[0] and "renamed upstream" in problems[0]
    assert "no longer reads ['PolicyModelActor']" in problems[1]
    block = compile("import json\nparser = argparse.ArgumentParser()\nwandb.init()\n", "main", "exec")
    assert isinstance(block, types.CodeType)
    msgs = main_block_violations(block)
    assert any("now reads ['wandb']" in m for m in msgs) and any("no longer reads ['train']" in m for m in msgs)


def test_cli_launch_refuses_a_mismatched_openrlhf(monkeypatch, capsys):
    from openrlhf_sgrpo.cli import train_ppo_ray
    from openrlhf_sgrpo.openrlhf_ext import upstream_contract

    monkeypatch.setattr(upstream_contract, "contract_violations", lambda: ["openrlhf.x.Y is missing"])
    argv = ["--rollout.n_samples_per_prompt", str(N), "--algo.advantage.estimator", "stratified_grpo"]
    assert train_ppo_ray.main(argv) == 2
    err = capsys.readouterr().err
    assert "does not match" in err and "openrlhf.x.Y is missing" in err


def test_ray_runtime_env_starts_workers_with_stand_ins_only_and_forwards_the_agent_config(monkeypatch):
    """Ray runs a worker_process_setup_hook before it assigns GPUs: ours only puts import stand-ins
    in place (test_cluster_ray checks it probes no CUDA)."""
    from openrlhf_sgrpo.cli.train_ppo_ray import ray_runtime_env

    monkeypatch.setenv("SGRPO_AGENT_CONFIG", "/runs/x/agent_config.yaml")
    monkeypatch.setenv("SERPER_API_KEY", "secret")  # the /search proxy's, never the workers'
    env = ray_runtime_env()
    assert set(env) == {"env_vars", "worker_process_setup_hook"}
    assert env["worker_process_setup_hook"].startswith("openrlhf_sgrpo.openrlhf_ext.gpu_import_standins.")
    assert env["env_vars"]["SGRPO_AGENT_CONFIG"] == "/runs/x/agent_config.yaml"
    assert "SERPER_API_KEY" not in env["env_vars"]
    assert env["env_vars"]["NCCL_DEBUG"] == "WARN"  # OpenRLHF's own default


ARCH_LISTS = ["9.0a", "8.0;9.0a+PTX", "8.0 10.0f 12.0a"]


def test_arch_suffixes_reach_the_workers_in_the_form_deepspeeds_builder_parses(monkeypatch):
    """The lent H200's image sets TORCH_CUDA_ARCH_LIST=9.0a; DeepSpeed 0.19.6's JIT builder (FusedAdam,
    in the policy actor) raised ValueError on it. Checked with DeepSpeed's own parser in a fresh
    interpreter (one for every list: the builder reads the variable at each call), raw and fixed."""
    from openrlhf_sgrpo.cli.train_ppo_ray import ray_runtime_env

    fixed = {}
    for given in ARCH_LISTS:
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", given)
        fixed[given] = ray_runtime_env()["env_vars"]["TORCH_CUDA_ARCH_LIST"]
    code = """
import json, os, sys
from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder
out = {}
for arch_list in json.loads(sys.argv[1]):
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list
    b = FusedAdamBuilder(); b.jit_mode = False
    try:
        out[arch_list] = ["ok", str(b.compute_capability_args())]
    except Exception as e:  # what a worker met with the raw value
        out[arch_list] = [type(e).__name__, str(e)]
print("RESULT " + json.dumps(out))
"""
    lists = [*ARCH_LISTS, *fixed.values()]
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(lists)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.split("RESULT ", 1)[1])
    for given in ARCH_LISTS:
        assert got[given][0] == "ValueError", (given, got[given])
        status, args = got[fixed[given]]
        assert status == "ok", (given, fixed[given], args)
        assert "sm_90" in args or "sm_100" in args, (given, args)
        assert ("+PTX" in fixed[given]) == ("+PTX" in given)


def test_arch_list_without_suffixes_is_left_as_the_user_set_it(monkeypatch):
    from openrlhf_sgrpo.cli.train_ppo_ray import ray_runtime_env

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0 9.0+PTX")
    assert "TORCH_CUDA_ARCH_LIST" not in ray_runtime_env()["env_vars"]  # workers inherit it unchanged
