"""``--sgrpo.rollout_engine hf``: the HF engine in vLLM's place in a training run.

What a CPU can check: the engine factory takes ``create_vllm_engines``'s exact signature (OpenRLHF's
``train()`` passes most of it positionally), refuses what it cannot serve, the CLI names the flags
the mode needs, the driver swaps the factory in and back, and weights load by name with a cast.
The CUDA IPC path (``update_weight_cuda_ipc``, as OpenRLHF's ``_handle_cuda_ipc`` sends) runs only
on a GPU: the last test, skipped without one. The whole mode ran on an H100 (docs/records/gpu_sessions.md).
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from openrlhf_sgrpo import assets
from openrlhf_sgrpo.testing import pythonpath_led_by

pytestmark = pytest.mark.usefixtures("openrlhf_gpu_stubs")

REPO = Path(__file__).resolve().parent.parent
AGENT_FILE = str(REPO / "agent_env" / "openrlhf_agent.py")


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    model, tok = assets.tiny_qwen2(seed=0)
    out = tmp_path_factory.mktemp("hf_engine") / "policy"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_engine_factory_has_upstreams_signature():
    from openrlhf.trainer.ray.vllm_engine import create_vllm_engines

    from openrlhf_sgrpo.openrlhf_ext.hf_rollout_actor import create_hf_engines_like_vllm

    ours, theirs = inspect.signature(create_hf_engines_like_vllm), inspect.signature(create_vllm_engines)
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == \
        [(p.name, p.kind, p.default) for p in theirs.parameters.values()]


@pytest.mark.parametrize("change, message", [
    ({"shared_pg": None}, "--train.colocate_all"),
    ({"tensor_parallel_size": 2}, "--vllm.tensor_parallel_size 1"),
    ({"agent_func_path": None}, "--train.agent_func_path"),
    ({"logprobs_mode": "processed_logprobs"}, "is_correction_level"),
])
def test_engine_factory_refuses_what_it_cannot_serve(change, message):
    from openrlhf_sgrpo.openrlhf_ext.hf_rollout_actor import create_hf_engines_like_vllm

    call = {"num_engines": 1, "tensor_parallel_size": 1, "pretrain": "p", "seed": 0, "full_determinism": False,
            "enable_prefix_caching": False, "enforce_eager": False, "max_model_len": 64, "shared_pg": object(),
            "agent_func_path": AGENT_FILE, **change}
    with pytest.raises(ValueError, match=message):
        create_hf_engines_like_vllm(**call)


HF_RUN = ["--rollout.n_samples_per_prompt", "4", "--algo.advantage.estimator", "stratified_grpo",
          "--sgrpo.rollout_engine", "hf", "--vllm.num_engines", "1"]


def test_cli_names_every_flag_the_hf_engine_needs(capsys):
    from openrlhf_sgrpo.cli import train_ppo_ray

    assert train_ppo_ray.main(HF_RUN + ["--dry_run"]) == 2
    err = capsys.readouterr().err
    assert "--sgrpo.rollout_engine hf needs --train.colocate_all, --train.agent_func_path" in err

    ok = HF_RUN + ["--train.colocate_all", "--train.agent_func_path", AGENT_FILE]
    assert train_ppo_ray.parse_config(ok).sgrpo.rollout_engine == "hf"
    assert train_ppo_ray.parse_config(HF_RUN[:4]).sgrpo.rollout_engine == "vllm"  # the default


def test_driver_swaps_the_engine_factory_in_and_back():
    import importlib

    from openrlhf.trainer.ray import create_vllm_engines

    from openrlhf_sgrpo.openrlhf_ext import actors
    from openrlhf_sgrpo.openrlhf_ext.hf_rollout_actor import create_hf_engines_like_vllm
    from openrlhf_sgrpo.openrlhf_ext.vllm_engines import create_vllm_engines_tracked

    module = importlib.import_module(actors.ENGINE_FACTORY[0])
    saved = {key: getattr(importlib.import_module(key[0]), key[1]) for key in actors.DRIVER_REPLACEMENTS}
    try:
        actors.install_actor_classes(hf_engines=True)
        assert module.create_vllm_engines is create_hf_engines_like_vllm
        actors.install_actor_classes()  # a later vLLM run in this process: upstream's factory, tracked
        assert module.create_vllm_engines is create_vllm_engines_tracked
    finally:
        module.create_vllm_engines = create_vllm_engines
        for (name, attr), cls in saved.items():
            setattr(importlib.import_module(name), attr, cls)


def test_worker_hook_stands_in_for_vllm_only_in_the_hf_mode():
    """HF mode: stand-ins for missing vllm and flash_attn; vLLM mode: flash_attn only (the rollout
    needs the real engine, and OpenRLHF imports flash-attn at module level, which has no wheel for
    the lent GPU machines' torch 2.11 + CUDA 13)."""
    from openrlhf_sgrpo.cli.train_ppo_ray import ray_runtime_env

    hf_hook = ray_runtime_env(hf_engines=True)["worker_process_setup_hook"]
    assert hf_hook == "openrlhf_sgrpo.openrlhf_ext.gpu_import_standins.install_missing"
    vllm_hook = ray_runtime_env()["worker_process_setup_hook"]
    assert vllm_hook == "openrlhf_sgrpo.openrlhf_ext.gpu_import_standins.install_missing_flash_attn"
    # a fresh interpreter, as a Ray worker starts: which modules the hook stood in for, and whether
    # vLLM is really installed there (this process may hold the test stubs)
    code = ("import importlib, importlib.util, json, sys; real = importlib.util.find_spec('vllm') is not None; "
            "m, _, f = {hook!r}.rpartition('.'); getattr(importlib.import_module(m), f)(); "
            "print(json.dumps([real, sorted(k for k in ('vllm', 'flash_attn') "
            "if k in sys.modules and sys.modules[k].__spec__.loader is None)]))")
    seen = {}
    for hook in (hf_hook, vllm_hook):
        out = subprocess.run([sys.executable, "-c", code.format(hook=hook)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        seen[hook] = json.loads(out.stdout.strip().splitlines()[-1])
    vllm_real = seen[vllm_hook][0]
    assert seen[vllm_hook][1] == ["flash_attn"]  # flash-attn is not installed on CPU machines
    assert seen[hf_hook][1] == (["flash_attn"] if vllm_real else ["flash_attn", "vllm"])


def test_weights_load_by_name_with_a_cast_and_bad_ones_are_named(policy_dir):
    from openrlhf_sgrpo.openrlhf_ext.hf_rollout_actor import HFRolloutActor

    actor = HFRolloutActor(str(policy_dir), AGENT_FILE)
    name, param = next(iter(actor.engine.model.named_parameters()))
    new = torch.randn(param.shape, dtype=torch.bfloat16)
    actor.load_weight(name, new)
    assert param.dtype == torch.float32 and torch.equal(param.data, new.float())
    assert actor.weights_loaded == 1
    with pytest.raises(ValueError, match=f"weight {name}: trainer shape"):
        actor.load_weight(name, torch.zeros(3))
    with pytest.raises(AttributeError):
        actor.load_weight("model.no_such.weight", new)
    with pytest.raises(NotImplementedError, match="--train.colocate_all"):
        actor.update_weight(name, torch.bfloat16, param.shape)


RECEIVER = """
import pickle, sys, torch
from openrlhf_sgrpo.openrlhf_ext import gpu_import_standins
gpu_import_standins.install(only_missing=True)
from openrlhf_sgrpo.openrlhf_ext.hf_rollout_actor import HFRolloutActor
policy, agent, handles_file, out_file = sys.argv[1:]
handles = pickle.load(open(handles_file, "rb"))
actor = HFRolloutActor(policy, agent, device="cuda")
for i, (name, dtype, shape, ipc) in enumerate(handles):
    actor.update_weight_cuda_ipc(name, dtype, shape, ipc_handles=ipc, empty_cache=i == len(handles) - 1)
params = dict(actor.engine.model.named_parameters())
torch.save({name: params[name].detach().float().cpu() for name, *_ in handles}, out_file)
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA IPC); the CPU tests above "
                                                          "cover loading by name")
def test_weights_arrive_over_cuda_ipc_as_openrlhf_sends_them(policy_dir, tmp_path):
    """The engine in its own process (as in a colocated run) opens each handle OpenRLHF's
    ``_handle_cuda_ipc`` builds on rank 0 and ends up with the trainer's exact tensors."""
    import os
    import pickle
    import subprocess
    import sys

    from openrlhf.trainer.ray.utils import get_physical_gpu_id
    from torch.multiprocessing.reductions import reduce_tensor
    from transformers import AutoModelForCausalLM

    trainer_model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.bfloat16).cuda()
    sent, handles = {}, []
    for name, param in trainer_model.named_parameters():
        weight = param.data.clone().normal_()  # kept alive here until the engine has read it
        sent[name] = weight
        handles.append((name, weight.dtype, weight.shape, {get_physical_gpu_id(): reduce_tensor(weight)}))
    torch.cuda.synchronize()
    (tmp_path / "handles.pkl").write_bytes(pickle.dumps(handles))
    env = {**os.environ, "PYTHONPATH": pythonpath_led_by(REPO, os.environ.get("PYTHONPATH"))}
    proc = subprocess.run([sys.executable, "-c", RECEIVER, str(policy_dir), AGENT_FILE, str(tmp_path / "handles.pkl"),
                           str(tmp_path / "got.pt")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "weights synced from the trainer" in proc.stdout
    got = torch.load(tmp_path / "got.pt")
    assert set(got) == set(sent)
    for name, weight in sent.items():
        assert torch.equal(got[name], weight.float().cpu()), name


def test_gpu_smokes_hf_runs_parse_with_openrlhfs_parser():
    """``scripts/gpu_smoke.py --engine hf``'s two runs pass OpenRLHF's parser and our checks."""
    import importlib.util

    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config

    spec = importlib.util.spec_from_file_location("gpu_smoke", REPO / "scripts" / "gpu_smoke.py")
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    paths = {"policy": Path("/p"), "data": Path("/d.jsonl"), "corpus": Path("/c.jsonl")}
    for run in ("A", "B"):
        args = parse_config(smoke.cli_args(paths, Path("/out"), run, 3, AGENT_FILE, "hf", 1e-4, 0.999))
        assert (args.sgrpo.rollout_engine, args.ds.attn_implementation) == ("hf", "sdpa")
        assert not args.vllm.enable_sleep and args.actor.adam.lr == 1e-4
    assert args.algo.sapo.enable and args.algo.sapo.ratio_threshold == 0.999
