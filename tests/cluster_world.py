"""The world the real-Ray tests share: a local Ray cluster (CPU, fake GPUs) started by our CLI's
``start_ray``, OpenRLHF's own vLLM engines (vLLM's CPU build), the fitted tiny policy, the real
retriever and sandbox on loopback, and the CPU stand-ins for what needs CUDA.

Loaded by ``test_cluster_ray.py`` and ``test_cluster_options.py`` as a plugin
(``pytest_plugins = ("cluster_world",)``), its helpers imported by name. The fixtures are
module-scoped, so each module starts its own cluster and one engine, and reads its own ``args``
fixture: the
engine's settings (``--data.max_len``, rollout log-probs on or off) and the agent's config
(``$SGRPO_AGENT_CONFIG``, read by the engine when it starts) are the module's.

Stand-ins, only where the machine cannot run the real thing (see the two modules' docstrings):
``flash_attn`` is import-stubbed in every Ray process (``ray_worker_site/sitecustomize.py``);
``ActorPPOTrainer``'s CUDA barrier and CUDA-pinned replay buffer are skipped
(:func:`cpu_actor_trainer`); DeepSpeed's model is a plain HF model (or OpenRLHF's own ``Actor``
wrapped around one).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
from engine_probe import policy_log_probs, scramble_  # noqa: F401 - the tests import them from here
from fitted_policy import fitted_policy_dir
from shm_check import shm_files
from sites import WORKER_SITE

from openrlhf_sgrpo.engine import vllm_unavailable_reason
from openrlhf_sgrpo.testing import pythonpath_led_by

NO_VLLM = vllm_unavailable_reason()

# The world both cluster modules run: samples per prompt, SGRPO alpha, tool turns, tokens per
# turn, context, sampling temperature.
N = 4  # samples per prompt
ALPHA = 0.6
MAX_TURNS = 2
TOKENS_PER_TURN = 16
MAX_LEN = 512
TEMPERATURE = 0.5
needs_vllm = pytest.mark.skipif(NO_VLLM is not None, reason=f"vLLM engine path: {NO_VLLM}")

REPO = Path(__file__).resolve().parent.parent
CORPUS = [
    {"id": "1", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "2", "contents": '"Nile"\nThe Nile flows north through Cairo into the Mediterranean.'},
    {"id": "3", "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare.'},
    {"id": "4", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
]


def ray_module(*test_modules: ModuleType):
    """``ray``, with this module and the calling test modules pickled by value: the workers cannot
    import ``tests/``, so functions defined here and there travel as code."""
    import engine_probe
    import ray
    from ray import cloudpickle

    for module in (sys.modules[__name__], engine_probe, *test_modules):
        cloudpickle.register_pickle_by_value(module)
    return ray


# ---------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cluster")


@pytest.fixture(scope="module")
def policy_dir() -> Path:
    """The fitted tiny Qwen2 of ``tests/fitted_policy.py``: the first question searches, the second
    runs code, the third answers (gold or wrong, half and half). Sampled at temperature 0.5, every
    batch reaches the retriever and the sandbox by construction, not by a lucky draw."""
    return fitted_policy_dir()


@pytest.fixture(scope="module")
def services(workdir):
    from openrlhf_sgrpo.local.services import cached_index_for, local_services

    corpus = workdir / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in CORPUS))
    with local_services(cached_index_for(corpus, progress=False), sandbox=True, topk=2) as urls:
        yield urls


@pytest.fixture(scope="module")
def agent_func_path() -> str:
    """The very path the launch scripts pass to --train.agent_func_path (examples/lib/launch.sh)."""
    out = subprocess.run(["bash", "-c", "source examples/lib/launch.sh && agent_func_path"], cwd=REPO,
                         env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def cluster(args, request):
    """A local Ray cluster with 4 fake GPUs, started by the CLI's start_ray; torn down after. The
    module's ``args`` fixture has set ``$SGRPO_AGENT_CONFIG``, which start_ray forwards to the workers."""
    import importlib

    from openrlhf_sgrpo.cli.train_ppo_ray import start_ray
    from openrlhf_sgrpo.openrlhf_ext.actors import DRIVER_REPLACEMENTS, ENGINE_FACTORY

    ray = ray_module(request.module)
    saved_env = dict(os.environ)
    restore = [*DRIVER_REPLACEMENTS, ENGINE_FACTORY]
    upstream = {key: getattr(importlib.import_module(key[0]), key[1]) for key in restore}
    os.environ["PYTHONPATH"] = pythonpath_led_by(WORKER_SITE, os.environ.get("PYTHONPATH"))
    # vLLM's CPU build: a 1 GiB KV cache, threads not pinned (forwarded to the workers by start_ray)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    # the engines' ZeroMQ socket files (vLLM never removes them) go here, not /tmp; forwarded too
    ipc_dir = tempfile.mkdtemp(prefix="sgrpo-vllm-ipc-")
    os.environ["VLLM_RPC_BASE_PATH"] = ipc_dir
    start_ray(address="local", num_cpus=16, num_gpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(ipc_dir, ignore_errors=True)
        os.environ.clear()
        os.environ.update(saved_env)
        for (module, name), cls in upstream.items():
            setattr(importlib.import_module(module), name, cls)


def create_engines_as_train_does(args) -> list:
    """OpenRLHF 0.11.2's ``train()`` call, argument for argument (no colocation: no shared pg), made
    through the name ``train()`` resolves, which ``start_ray`` pointed at our tracked factory."""
    import openrlhf.cli.train_ppo_ray as upstream_cli

    return upstream_cli.create_vllm_engines(
        args.vllm.num_engines, args.vllm.tensor_parallel_size, args.actor.model_name_or_path, args.train.seed,
        args.train.full_determinism_enable, args.vllm.enable_prefix_caching, args.vllm.enforce_eager,
        args.data.max_len, None, args.vllm.gpu_memory_utilization, args.vllm.enable_sleep,
        "processed_logprobs" if args.algo.advantage.is_correction_level != "off" else None,
        agent_func_path=args.train.agent_func_path, remote_rm_url=args.reward.remote_url,
        max_images_per_prompt=getattr(args.data, "max_images_per_prompt", 0))


@pytest.fixture(scope="module")
def shm_before_engines(cluster) -> set[str]:
    return shm_files()


@pytest.fixture(scope="module")
def engines(cluster, args, shm_before_engines):
    """One vLLM engine for the module (it takes ~1 min to start on 2 cores)."""
    if NO_VLLM:
        pytest.skip(f"vLLM engine path: {NO_VLLM}")
    from openrlhf_sgrpo.openrlhf_ext.vllm_engines import shutdown_engines

    made = create_engines_as_train_does(args)
    assert cluster.get(made[0].get_num_unfinished_requests.remote()) == 0  # waits for the engine to be up
    yield made
    shutdown_engines(made)


def trainer_kwargs(args) -> dict:
    """The generate kwargs OpenRLHF's train() passes to PPOTrainer.remote (0.11.2)."""
    return {"do_sample": True, "max_len": args.data.max_len, "max_new_tokens": args.rollout.max_new_tokens,
            "temperature": args.rollout.temperature, "top_p": args.rollout.top_p}


# ------------------------------------------------------------------ CPU stand-ins for CUDA code

def single_process_group() -> None:
    """torch.distributed's default group of one, as DeepSpeed's ``setup_distributed`` makes it in a
    real run, over an in-memory store (a ``file://`` store's file would stay behind in /tmp)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def cpu_actor_trainer(args, model, vllm_engines=None, strategy=None, scheduler=None):
    """An ``ActorPPOTrainer`` built in this process as the policy actor builds it, minus CUDA: its
    barrier and CUDA-pinned replay buffer are skipped, ``model`` stands where DeepSpeed's engine
    wraps the HF model (``model.module``) unless it is already an OpenRLHF ``Actor``."""
    from openrlhf.trainer.ray import ppo_actor

    ppo_actor.torch_dist_barrier_and_cuda_sync = lambda: None  # CUDA-only
    ppo_actor.NaiveReplayBuffer = lambda *a, **k: None  # pins to cuda:N in its constructor
    from openrlhf.models import Actor

    optim = torch.optim.SGD(model.parameters(), lr=0.0)
    actor = model if isinstance(model, Actor) else SimpleNamespace(model=SimpleNamespace(module=model))
    return ppo_actor.ActorPPOTrainer(strategy or SimpleNamespace(args=args), actor, None, optim, scheduler,
                                     vllm_engines=vllm_engines)


def sample_record(s) -> dict:
    """One generated sample (an ``Experience`` of one row) as plain data."""
    return {"prompt": s.prompts[0], "label": s.labels[0], "reward": float(s.rewards[0]),
            "score": None if s.scores is None else float(s.scores[0]),
            "info": {k: float(v[0]) for k, v in s.info.items()},
            "sequence": s.sequences[0].tolist(), "action_mask": s.action_mask[0].tolist(),
            "rollout_log_probs": None if s.rollout_log_probs is None else s.rollout_log_probs[0].tolist()}


def experiences_of(maker, samples) -> list:
    """The experience maker's split and advantages, with a zero KL standing in for
    ``make_experience``'s CUDA-only actor/reference forwards."""
    experiences = maker.split_rollout_samples(samples)
    for e in experiences:
        e.kl = torch.zeros(e.action_mask.shape, dtype=torch.float32)
    return maker.compute_advantages_and_returns(experiences)


def generator_batch(generator) -> tuple[list, int]:
    """Inside a trainer (or the async trainer's GenerateSamplesActor): one batch from its
    ``SamplesGenerator``, as its fit() loop makes it over episodes, and the prompts it consumed.
    Where the last batch took the data's last prompts, upstream's generator finds the data
    exhausted on its next call (an empty batch, no generation) and starts the next pass over it
    on the call after: one trainer serves batch after batch."""
    samples, _, prompts_consumed, exhausted = generator.samples_generator.generate_samples(**generator.generate_kwargs)
    if not samples and exhausted:
        samples, _, prompts_consumed, _ = generator.samples_generator.generate_samples(**generator.generate_kwargs)
    return samples, prompts_consumed


def turn_ranges(info: dict, max_turns: int) -> list[tuple[str, int, int]]:
    """The agent's turns of one sample: (kind, first token, end token) over the sequence."""
    from agent_env import info_keys as K

    turns = []
    for k in range(K.max_turn_slots(max_turns)):
        kind = int(info[K.turn_kind_key(k)])
        if kind != K.PAD:
            turns.append((K.KIND_NAMES[kind], int(info[K.turn_start_key(k)]), int(info[K.turn_end_key(k)])))
    return turns


def check_engine_contract(raw: list[dict], tokenizer, *, max_len: int, max_turns: int, tokens_per_turn: int) -> None:
    """What the agent relies on from the engine, read off the finished trajectories."""
    from agent_env import info_keys as K

    for r in raw:
        seq, mask = r["sequence"], r["action_mask"]
        assert len(seq) <= max_len  # the total budget
        turns = turn_ranges(r["info"], max_turns)
        assert 1 <= len(turns) <= K.max_turn_slots(max_turns)
        action_cols = set()
        for kind, start, end in turns:
            assert 0 < end - start <= tokens_per_turn  # the per-turn budget
            text = tokenizer.decode(seq[start:end])
            if kind in ("search", "code", "answer"):  # the turn ended at its closer, nothing after it
                closer = f"</{kind}>"
                assert closer in text and text.rstrip().endswith(closer), (kind, text)
            action_cols |= set(range(start - 1, end - 1))  # action_mask column i is sequence token i + 1
        # the action mask is exactly the turns' tokens: tool observations and the prompt are masked out
        assert {i for i, m in enumerate(mask) if m} == action_cols
        # a rollout log-prob exists for every action token (a real one: log p < 0 ... up to 0 for
        # a certain token) and is the placeholder 0.0 on every observation token
        lp = r["rollout_log_probs"]
        assert lp is not None and len(lp) == len(mask)
        assert all(lp[i] == 0.0 for i in range(len(mask)) if not mask[i])
        assert all(lp[i] <= 0.0 for i in action_cols) and any(lp[i] < 0.0 for i in action_cols)
