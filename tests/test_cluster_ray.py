"""The cluster path on a real local Ray cluster (CPU, fake GPU resources), started through the
CLI's own ``start_ray`` — what ``python -m openrlhf_sgrpo.cli.train_ppo_ray`` runs before
OpenRLHF's ``train()`` — with the actor classes ``train()`` looks up.

Stand-ins, only where the machine cannot run the real thing:
- the vLLM engine boundary: :class:`~openrlhf_sgrpo.openrlhf_ext.hf_rollout_actor.HFRolloutActor`
  (the project's HF engine behind OpenRLHF's ``RolloutRayActor`` interface, a tiny Qwen2 fitted to
  the action format); the ``vllm``/``flash_attn`` imports are stubbed in every Ray process by
  ``tests/ray_worker_site/sitecustomize.py``, which also records ``torch.cuda`` probes;
- CUDA-only model code: ``make_experience``'s actor/reference forwards (log-probs, KL) become a
  zero KL, and ``ActorPPOTrainer``'s CUDA barrier and CUDA-pinned replay buffer are skipped, as
  in ``test_sapo.py``. OpenRLHF's ``NaiveReplayBuffer`` pins to ``cuda:N`` in its constructor, so
  its steps (``split_experience_batch``, ``remove_padding_in_sequences``, ``make_experience_batch``)
  are called directly.
Everything else is real: Ray, ``RayActorGroup``, OpenRLHF's ``PPOTrainer``/``PPOTrainerAsync``
(our subclasses), ``SamplesGenerator``, ``_load_agent_executor`` on the file the launch scripts
pass, our agent against the real retriever on loopback, our experience maker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import torch

from openrlhf_sgrpo import assets

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("openrlhf_gpu_stubs")]

REPO = Path(__file__).resolve().parent.parent
WORKER_SITE = Path(__file__).with_name("ray_worker_site")
N = 4  # samples per prompt
ALPHA = 0.6
QUESTIONS = [("which city is the capital of france", "Paris"),
             ("which river flows through cairo", "Nile"),
             ("who wrote the play hamlet", "Shakespeare")]
CORPUS = [
    {"id": "1", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "2", "contents": '"Nile"\nThe Nile flows north through Cairo into the Mediterranean.'},
    {"id": "3", "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare.'},
    {"id": "4", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
]


def _ray_module():
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests/
    return ray


# ---------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cluster")


@pytest.fixture(scope="module")
def policy_dir(workdir) -> Path:
    """A tiny Qwen2 fitted to the action format: 3 of 4 first actions are a search, so every batch
    reaches the retriever (P(no search in 12 trajectories) ~ 1e-7 for any seed or CPU)."""
    from openrlhf_sgrpo.local.warmup import format_warmup

    model, tok = assets.tiny_qwen2(seed=0)
    pairs = []
    for question, gold in QUESTIONS:
        pairs += [(question, f" <search> {question.split()[-1]} </search>")] * 3
        pairs += [(question, f" <answer> {gold} </answer>")]
    format_warmup(model, tok, [], steps=60, pairs=pairs, batch_size=8)
    out = workdir / "policy"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def retriever(workdir):
    from openrlhf_sgrpo.local.services import cached_index_for, local_services

    corpus = workdir / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in CORPUS))
    with local_services(cached_index_for(corpus, progress=False), sandbox=False, topk=2) as urls:
        yield urls.retriever_url


@pytest.fixture(scope="module")
def agent_func_path() -> str:
    """The very path the launch scripts pass to --train.agent_func_path (examples/lib/launch.sh)."""
    out = subprocess.run(["bash", "-c", "source examples/lib/launch.sh && agent_func_path"], cwd=REPO,
                         env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def args(workdir, policy_dir, retriever, agent_func_path):
    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config

    data = workdir / "train.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answers": [g]}) + "\n" for q, g in QUESTIONS))
    config = workdir / "agent_config.yaml"
    config.write_text(f"retriever_url: {retriever}\ntemplate: none\nmax_turns: 2\ntopk: 2\n"
                      f"max_tokens_per_turn: 16\nreward: em\n")
    os.environ["SGRPO_AGENT_CONFIG"] = str(config)  # forwarded to every Ray worker by ray_runtime_env()
    return parse_config([
        "--actor.model_name_or_path", str(policy_dir), "--train.agent_func_path", agent_func_path,
        "--data.prompt_dataset", str(data), "--data.input_key", "question", "--data.label_key", "answers",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "2",
        "--data.max_len", "512", "--rollout.max_new_tokens", "16",
        "--rollout.batch_size", str(len(QUESTIONS)), "--rollout.n_samples_per_prompt", str(N),
        "--rollout.micro_batch_size", "2", "--train.batch_size", str(len(QUESTIONS) * N),
        "--train.micro_batch_size", "2", "--algo.kl.init_coef", "0",
        "--algo.advantage.estimator", "stratified_grpo", "--algo.advantage.sgrpo_alpha", str(ALPHA),
        "--algo.sapo.enable", "--ckpt.path", str(workdir / "ckpt"),
        "--sgrpo.dump_rollouts", "2", "--sgrpo.run_dir", str(workdir / "run"),
    ])


@pytest.fixture(scope="module")
def cluster(args):
    """A local Ray cluster with 4 fake GPUs, started by the CLI's start_ray; torn down after."""
    import importlib

    from openrlhf_sgrpo.cli.train_ppo_ray import start_ray
    from openrlhf_sgrpo.openrlhf_ext.actors import DRIVER_REPLACEMENTS

    ray = _ray_module()
    saved_env = dict(os.environ)
    upstream = {key: getattr(importlib.import_module(key[0]), key[1]) for key in DRIVER_REPLACEMENTS}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKER_SITE), os.environ.get("PYTHONPATH")]))
    start_ray(num_cpus=16, num_gpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(saved_env)
        for (module, name), cls in upstream.items():
            setattr(importlib.import_module(module), name, cls)


def _trainer_kwargs(args) -> dict:
    """The generate kwargs OpenRLHF's train() passes to PPOTrainer.remote (0.11.2)."""
    return dict(do_sample=True, max_len=args.data.max_len, max_new_tokens=args.rollout.max_new_tokens,
                temperature=args.rollout.temperature, top_p=args.rollout.top_p)


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
    from types import SimpleNamespace

    from openrlhf.trainer.ray import ppo_actor

    ppo_actor.torch_dist_barrier_and_cuda_sync = lambda: None  # CUDA-only
    ppo_actor.NaiveReplayBuffer = lambda *a, **k: None  # pins to cuda:N in its constructor
    model = torch.nn.Linear(1, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.0)
    trainer = ppo_actor.ActorPPOTrainer(SimpleNamespace(args=args), model, None, optim, None)
    return type(trainer.actor_loss_fn).__name__


def _maker_class(trainer) -> str:
    return type(trainer.experience_maker).__name__


def _async_training_actor_maker_class(trainer) -> str:
    import ray

    return ray.get(trainer.trainer_actor.__ray_call__.remote(_maker_class))


def _rollout_to_experiences(trainer):
    """Inside the sync trainer: OpenRLHF's SamplesGenerator → split → our advantages."""
    samples, _, _, _ = trainer.samples_generator.generate_samples(**trainer.generate_kwargs)
    raw = [{"prompt": s.prompts[0], "reward": float(s.rewards[0]),
            "info": {k: float(v[0]) for k, v in s.info.items()}} for s in samples]
    experiences = trainer.experience_maker.split_rollout_samples(samples)
    for e in experiences:  # stand-in for make_experience's CUDA-only actor/reference forwards
        e.kl = torch.zeros(e.action_mask.shape, dtype=torch.float32)
    return raw, trainer.experience_maker.compute_advantages_and_returns(experiences)


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
    """What our runtime env runs at worker start (nothing; with the HF engine, the import stand-ins) passes; the old setup hook (importing
    OpenRLHF's trainer module, hence DeepSpeed) is caught by the same instrumentation."""
    from openrlhf_sgrpo.cli.train_ppo_ray import ray_runtime_env

    def probes_at_worker_start(start_code: str) -> list:
        code = f"import json, sitecustomize\n{start_code}\nprint(json.dumps(sitecustomize.CUDA_PROBES))\n"
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKER_SITE), os.environ.get("PYTHONPATH")]))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    for runtime_env in (ray_runtime_env(), ray_runtime_env(hf_engines=True)):  # none, the stand-in installer
        hook = runtime_env.get("worker_process_setup_hook")
        ours = "" if hook is None else (f"import importlib; m, _, f = {hook!r}.rpartition('.'); "
                                        f"getattr(importlib.import_module(m), f)()")
        assert probes_at_worker_start(ours) == []
    # the old hook's first step: import OpenRLHF's trainer module (DeepSpeed probes CUDA on import)
    assert ("device_count", None) in [tuple(p) for p in probes_at_worker_start("import openrlhf.trainer.ppo_trainer")]


def test_sync_and_async_trainers_build_our_experience_maker(cluster, args, policy_dir, agent_func_path):
    from openrlhf.trainer.ppo_trainer import PPOTrainer
    from openrlhf.trainer.ppo_trainer_async import PPOTrainerAsync
    from openrlhf.utils import get_strategy

    from openrlhf_sgrpo.openrlhf_ext.hf_rollout_actor import create_hf_engines

    ray = cluster
    strategy = get_strategy(args)
    engines = create_hf_engines(1, str(policy_dir), agent_func_path)
    trainers = [PPOTrainer.remote(args.actor.model_name_or_path, strategy, None, None, None, None, engines,
                                  **_trainer_kwargs(args))]
    trainers.append(PPOTrainerAsync.remote(args.actor.model_name_or_path, strategy, None, None, None, None, engines,
                                           **_trainer_kwargs(args)))
    try:
        assert ray.get(trainers[0].__ray_call__.remote(_maker_class)) == "StratifiedExperienceMaker"
        assert ray.get(trainers[1].__ray_call__.remote(_async_training_actor_maker_class)) == \
            "StratifiedExperienceMaker"
        assert ray.get(trainers[0].get_max_steps.remote()) == 1  # 3 prompts x 4 samples, one batch of 12
    finally:
        for actor in [*trainers, *engines]:
            ray.kill(actor)


def test_data_path_samples_generator_to_batched_advantages(cluster, args, policy_dir, agent_func_path, retriever):
    from openrlhf.trainer.ppo_trainer import PPOTrainer
    from openrlhf.trainer.ppo_utils.experience import (
        make_experience_batch,
        remove_padding_in_sequences,
        split_experience_batch,
    )
    from openrlhf.utils import get_strategy

    from agent_env import info_keys as K
    from openrlhf_sgrpo.advantages import stratified_advantages
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import ADVANTAGE_INFO_KEY
    from openrlhf_sgrpo.openrlhf_ext.hf_rollout_actor import create_hf_engines

    ray = cluster
    searches_before = requests.get(retriever.rsplit("/", 1)[0] + "/metrics", timeout=10).json()["queries"]
    engines = create_hf_engines(2, str(policy_dir), agent_func_path, seed=1)
    trainer = PPOTrainer.remote(args.actor.model_name_or_path, get_strategy(args), None, None, None, None, engines,
                                **_trainer_kwargs(args))
    try:
        raw, experiences = ray.get(trainer.__ray_call__.remote(_rollout_to_experiences))
    finally:
        for actor in [trainer, *engines]:
            ray.kill(actor)

    # (c) OpenRLHF's loader ran our agent file in the engines; the agent searched the real retriever
    assert len(raw) == len(QUESTIONS) * N
    searches = requests.get(retriever.rsplit("/", 1)[0] + "/metrics", timeout=10).json()["queries"] - searches_before
    tool_calls = [r["info"][K.TOOL_CALLS] for r in raw]
    assert sum(tool_calls) > 0 and searches >= 1
    assert all(set(K.metadata_keys(2, 2)) <= set(r["info"]) for r in raw)  # the agent's whole record arrived

    # prompt groups are contiguous in index order (split_rollout_samples numbers samples in order)
    order = [i for e in experiences for i in e.index]
    assert sorted(order) == list(range(len(raw)))
    for g in range(len(QUESTIONS)):
        assert len({raw[i]["prompt"] for i in range(g * N, (g + 1) * N)}) == 1

    # (d) advantages after Ray serialization equal the estimator on the agent's own rewards and strata
    rewards = torch.tensor([r["reward"] for r in raw])
    strata = torch.tensor([int(r["info"][K.TOOL_CALLS]) for r in raw])
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
