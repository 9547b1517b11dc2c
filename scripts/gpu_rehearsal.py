"""The device run's steps that need no CUDA device, run on a CPU (issue #34); each check says PASS or FAIL.

    python scripts/gpu_rehearsal.py [--check NAME ...] [--out DIR]

Run by ``scripts/gpu_rehearsal.sh`` inside an environment that mirrors the lent GPU machine
(Python 3.12, the image's torch 2.11.0+cu130 and transformers, the pieces that
``gpu_vllm_pieces.sh`` cuts, unpacked as ``gpu_vllm_run.sh`` unpacks them), with the environment
variables ``gpu_vllm_run.sh`` sets. One check, ``deepspeed_optimizer``, also runs in the project's
own venv (``tests/test_gpu_rehearsal.py``). Checks:

- ``versions``: the versions ``gpu_vllm_run.sh`` prints, and torch's CUDA build.
- ``driver``: what the CLI's driver imports and runs before Ray: the flash-attn stand-ins, the
  upstream contract check (``contract_violations``), OpenRLHF's ``train``, our actor classes.
- ``parse``: ``gpu_smoke.py --dry-run`` with the device sequence's flags: the smoke's data, the
  retriever on loopback, OpenRLHF's parser on run A (stratified_grpo) and run B (SAPO + CalibAdv,
  two optimizer steps per rollout).
- ``agent``: OpenRLHF's own agent loader (``_load_agent_executor``) on ``agent_env/openrlhf_agent.py``.
- ``engine_args``: the keyword arguments OpenRLHF's ``create_vllm_engines`` gives each
  ``RolloutRayActor`` (called as ``train()`` calls it, the actor recorded instead of started), then
  built into vLLM's ``AsyncEngineArgs`` exactly as the actor does; the worker extension class imported.
- ``vllm_contract``: what ``RolloutRayActor`` calls on vLLM's engine (names, keywords against the
  signatures) and what OpenRLHF's ``WorkerWrap`` (the weight sync) reads on vLLM's GPU worker.
- ``workers``: Ray started with the CLI's runtime env (its worker hook runs in every worker); one
  fresh actor process per kind of worker (rollout engine, policy, reference, trainer) imports
  what that worker imports.
- ``deepspeed_optimizer``: the smoke's DeepSpeed config for the policy, through OpenRLHF's
  ``DeepspeedStrategy.prepare`` and DeepSpeed's own optimizer factory on DeepSpeed's CPU
  accelerator: with ``--sgrpo.optimizer torch_fused`` the optimizer is torch's fused AdamW and
  DeepSpeed's op builder is never asked to build; with the default it is (the control).
- ``policy_step``: the smoke's real policy through OpenRLHF's ``Actor`` and ``strategy.prepare``
  (transformers of the image, SDPA, bf16, ZeRO-2, fused AdamW): two optimizer steps, nothing built.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]
# The flags gpu_vllm_run.sh passes after `--` (both runs).
DEVICE_EXTRA = os.environ.get("REHEARSAL_EXTRA", "").split()

CHECKS: dict[str, Callable[[Path], str]] = {}


def check(fn: Callable[[Path], str]) -> Callable[[Path], str]:
    CHECKS[fn.__name__] = fn
    return fn


def smoke_args(run: str, out: Path, extra: list[str] | None = None, policy: str | None = None) -> SimpleNamespace:
    """Run A's or B's hierarchized config, parsed by OpenRLHF's parser with the device's flags
    (``policy``: the model folder; default the smoke's SmolLM2)."""
    import gpu_smoke

    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config

    if policy is None:
        from openrlhf_sgrpo.local.models import policy_folder

        policy = str(policy_folder("smollm2"))
    paths = {"policy": Path(policy), "data": out / "train.jsonl", "corpus": out / "corpus.jsonl"}
    flags = gpu_smoke.cli_args(paths, out, run, 2, str(REPO / "agent_env" / "openrlhf_agent.py"))
    return parse_config(flags + DEVICE_EXTRA + (extra or []))


@check
def versions(out: Path) -> str:
    import importlib.metadata as md
    import platform

    import torch

    found = {"python": platform.python_version(), "torch.cuda": torch.version.cuda}
    for name in ("torch", "transformers", "vllm", "ray", "deepspeed", "openrlhf", "numpy", "tokenizers"):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            found[name] = "MISSING"
    missing = [k for k, v in found.items() if v in ("MISSING", None)]
    text = ", ".join(f"{k} {v}" for k, v in found.items())
    if missing:
        raise RuntimeError(f"missing: {missing} ({text})")
    return text


@check
def driver(out: Path) -> str:
    from openrlhf_sgrpo.openrlhf_ext import gpu_import_standins

    gpu_import_standins.install_missing_flash_attn()  # what launch() runs for the vLLM path
    from openrlhf_sgrpo.openrlhf_ext.upstream_contract import contract_violations

    problems = contract_violations()
    if problems:
        raise RuntimeError("upstream contract: " + "; ".join(problems))
    from openrlhf.cli.train_ppo_ray import train  # noqa: F401 - what launch() imports

    from openrlhf_sgrpo.openrlhf_ext import actors, vllm_engines  # noqa: F401

    return "contract holds; train, our actor classes and the engine tracker import"


@check
def parse(out: Path) -> str:
    cmd = [sys.executable, str(REPO / "scripts" / "gpu_smoke.py"), "--dry-run", "--steps", "2", "--no-sandbox",
           "--out", str(out / "smoke"), "--", *DEVICE_EXTRA]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"gpu_smoke --dry-run exit {proc.returncode}: {proc.stderr[-2500:]}")
    runs = [line for line in proc.stdout.splitlines() if line.startswith("[gpu_smoke]")]
    if len(runs) != 2:
        raise RuntimeError(f"expected two parsed runs, got {runs}")
    for run in ("A", "B"):
        args = smoke_args(run, out / "smoke")
        if args.sgrpo.optimizer != "torch_fused":
            raise RuntimeError(f"run {run}: --sgrpo.optimizer is {args.sgrpo.optimizer}")
    b = smoke_args("B", out / "smoke")
    if not (b.algo.sapo.enable and b.algo.calibadv.enable and b.train.batch_size * 2 == 32):
        raise RuntimeError("run B is not SAPO + CalibAdv with two optimizer steps per rollout")
    return "run A and run B parse with OpenRLHF's parser (retriever up, data prepared)"


@check
def agent(out: Path) -> str:
    from agent_env.config import CONFIG_ENV

    from openrlhf_sgrpo.openrlhf_ext import gpu_import_standins

    gpu_import_standins.install_missing_flash_attn()
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

    config = out / "agent_config.yaml"
    config.write_text("retriever_url: http://127.0.0.1:9/retrieve\ntemplate: search_r1_chat\nmax_turns: 3\n")
    os.environ[CONFIG_ENV] = str(config)
    executor = _load_agent_executor(str(REPO / "agent_env" / "openrlhf_agent.py"))
    return f"OpenRLHF's loader built {type(executor).__module__}.{type(executor).__name__}"


@check
def engine_args(out: Path) -> str:
    from openrlhf_sgrpo.openrlhf_ext import gpu_import_standins

    gpu_import_standins.install_missing_flash_attn()
    import openrlhf.trainer.ray.vllm_engine as ve
    import vllm

    recorded: list[dict] = []

    class Recorder:  # RolloutRayActor.options(...).remote(**kwargs), and the sleep call after it
        def options(self, **_):
            return self

        def remote(self, **kwargs):
            recorded.append(kwargs)
            return SimpleNamespace(sleep=SimpleNamespace(remote=lambda *a, **k: None))

    real_actor, real_get = ve.RolloutRayActor, ve.ray.get
    ve.RolloutRayActor, ve.ray.get = Recorder(), (lambda refs: refs)
    try:
        for run in ("A", "B"):
            args = smoke_args(run, out)
            pg = SimpleNamespace(id=None)  # train() passes its colocated placement group
            ve.PlacementGroupSchedulingStrategy = lambda **kw: kw
            ve.create_vllm_engines(
                args.vllm.num_engines, args.vllm.tensor_parallel_size, args.actor.model_name_or_path,
                args.train.seed, args.train.full_determinism_enable, args.vllm.enable_prefix_caching,
                args.vllm.enforce_eager, args.data.max_len,
                pg if args.train.colocate_all and not args.train.async_enable else None,
                args.vllm.gpu_memory_utilization, args.vllm.enable_sleep,
                "processed_logprobs" if args.algo.advantage.is_correction_level != "off" else None,
                agent_func_path=args.train.agent_func_path, remote_rm_url=args.reward.remote_url,
                max_images_per_prompt=getattr(args.data, "max_images_per_prompt", 0))
    finally:
        ve.RolloutRayActor, ve.ray.get = real_actor, real_get
        importlib.reload(ve)
    built = []
    for kwargs in recorded:  # RolloutRayActor.__init__: these are its own, the rest is vLLM's
        kwargs = dict(kwargs)
        for own in ("bundle_indices", "agent_func_path", "remote_rm_url", "mm_pad_token_ids", "num_gpus",
                    "full_determinism"):
            kwargs.pop(own, None)
        engine_args = vllm.AsyncEngineArgs(**kwargs)
        built.append({k: getattr(engine_args, k) for k in sorted(kwargs)})
    module, cls = built[0]["worker_extension_cls"].rsplit(".", 1)
    getattr(importlib.import_module(module), cls)
    (out / "engine_args.json").write_text(json.dumps(built, indent=1, default=str))
    return f"{len(built)} engines' AsyncEngineArgs built: " + json.dumps(built[0], default=str)


def _self_attrs(cls: type) -> tuple[set[str], set[str], list[tuple[str, list[str]]]]:
    """What ``cls``'s own methods read and assign on ``self``, and its ``self.llm.<name>(kw=...)`` calls."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    reads, writes, llm_calls = set(), set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            (writes if isinstance(node.ctx, ast.Store) else reads).add(node.attr)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "llm"):
            llm_calls.append((node.func.attr, [k.arg for k in node.keywords if k.arg]))
    return reads, writes, llm_calls


def _assigned_on_self(classes: list[type], attr: str) -> bool:
    """Whether any of ``classes`` (their MROs' sources) assigns ``self.<attr>``."""
    import inspect
    import re

    pattern = re.compile(rf"self\.{attr}\s*(:[^=]+)?=[^=]")
    for cls in classes:
        for base in cls.__mro__:
            try:
                if pattern.search(inspect.getsource(base)):
                    return True
            except (OSError, TypeError):
                continue
    return False


@check
def vllm_contract(out: Path) -> str:
    """What OpenRLHF 0.11.2 calls on vLLM 0.26.0 that only a GPU run would exercise: the engine
    methods ``RolloutRayActor`` calls (names and keywords against their signatures) and what
    its worker extension ``WorkerWrap`` (CUDA IPC / NCCL weight sync) reads on vLLM's GPU worker."""
    import inspect

    from openrlhf_sgrpo.openrlhf_ext import gpu_import_standins

    gpu_import_standins.install_missing_flash_attn()
    import vllm
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor
    from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap
    from vllm.model_executor.models.llama import LlamaForCausalLM
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as RunnerV2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as RunnerV1
    from vllm.v1.worker.gpu_worker import Worker

    problems = []
    engine = vllm.AsyncLLMEngine
    _, _, calls = _self_attrs(RolloutRayActor.__ray_actor_class__)
    for name, keywords in calls:
        method = getattr(engine, name, None)
        if method is None:
            if not _assigned_on_self([engine], name):
                problems.append(f"AsyncLLMEngine has no {name}")
            continue
        params = inspect.signature(method).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        problems += [f"AsyncLLMEngine.{name} takes no {k}=" for k in keywords if k not in params and not takes_any]
    reads, writes, _ = _self_attrs(WorkerWrap)
    needed = sorted(reads - writes - {n for n in dir(WorkerWrap)})
    problems += [f"vLLM's GPU Worker never sets self.{a} (WorkerWrap reads it)"
                 for a in needed if not _assigned_on_self([Worker], a)]
    problems += [f"{r.__module__}.{r.__name__} never sets self.model (WorkerWrap loads weights through it)"
                 for r in (RunnerV1, RunnerV2) if not _assigned_on_self([r], "model")]
    if not callable(getattr(LlamaForCausalLM, "load_weights", None)):
        problems.append("vLLM's LlamaForCausalLM (SmolLM2) has no load_weights")
    if problems:
        raise RuntimeError("; ".join(problems))
    return (f"{len(calls)} engine calls of RolloutRayActor match AsyncLLMEngine; WorkerWrap's reads "
            f"{needed} are set by vLLM's GPU Worker; both model runners set .model")


WORKER_IMPORTS = {
    "rollout engine (RolloutRayActor)": [
        "openrlhf.trainer.ray.vllm_engine", "openrlhf.trainer.ray.vllm_worker_wrap", "vllm.v1.engine.async_llm",
        "vllm.v1.sample.sampler", "vllm.model_executor.models.llama", "vllm.v1.worker.gpu_worker",
        "agent_env.executor", "openrlhf_sgrpo.openrlhf_ext.vllm_engines"],
    "policy (PolicyModelActor)": [
        "openrlhf.trainer.ray.ppo_actor", "openrlhf_sgrpo.openrlhf_ext.actors",
        "openrlhf_sgrpo.openrlhf_ext.sapo_actor",
        "openrlhf_sgrpo.openrlhf_ext.torch_adam", "openrlhf_sgrpo.openrlhf_ext.cpu_weight_sync", "deepspeed",
        "deepspeed.runtime.zero.stage_1_and_2", "openrlhf.models", "transformers.models.llama.modeling_llama"],
    "reference (ReferenceModelActor)": ["openrlhf.trainer.ray.launcher", "openrlhf.models"],
    "trainer (PPOTrainer)": [
        "openrlhf.trainer.ppo_trainer", "openrlhf.trainer.ppo_utils.samples_generator",
        "openrlhf_sgrpo.openrlhf_ext.experience_maker", "openrlhf_sgrpo.openrlhf_ext.calibadv_hook",
        "openrlhf.utils.logging_utils", "torch.utils.tensorboard"],
}


@check
def workers(out: Path) -> str:
    import ray

    from openrlhf_sgrpo.cli.train_ppo_ray import ray_runtime_env

    ray.init(address="local", num_cpus=4, runtime_env=ray_runtime_env(False), include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote(num_cpus=0)
        class Importer:
            def run(self, modules: list[str]) -> dict[str, str]:
                import importlib as il
                import traceback as tb

                failed = {}
                for m in modules:
                    try:
                        il.import_module(m)
                    except BaseException:  # noqa: BLE001 - every failure reported, none fatal here
                        failed[m] = tb.format_exc(limit=-3)
                return failed

        handles = {kind: Importer.remote() for kind in WORKER_IMPORTS}
        failed = {kind: ray.get(h.run.remote(WORKER_IMPORTS[kind]), timeout=900) for kind, h in handles.items()}
    finally:
        ray.shutdown()
    bad = {k: v for k, v in failed.items() if v}
    if bad:
        raise RuntimeError(json.dumps(bad, indent=1))
    return f"{sum(map(len, WORKER_IMPORTS.values()))} imports in {len(WORKER_IMPORTS)} fresh Ray workers"


def _refuse_op_builds() -> list[str]:
    """Make DeepSpeed's op builder raise (and record) instead of compiling anything."""
    import deepspeed
    from deepspeed.ops.op_builder.builder import OpBuilder

    asked: list[str] = []

    def refuse(self, *args, **kwargs):
        asked.append(self.name)
        raise RuntimeError(f"DeepSpeed's op builder was asked to build {self.name}")

    # the CPU accelerator's shared-memory collective (a CUDA run uses NCCL and builds nothing)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    OpBuilder.load = OpBuilder.jit_load = refuse
    return asked


def _deepspeed_on_cpu() -> list[str]:
    """One rank of gloo on DeepSpeed's CPU accelerator, the op builder refused (once per process)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for k, v in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    global _ASKED
    if _ASKED is None:
        from openrlhf_sgrpo.openrlhf_ext import gpu_import_standins

        gpu_import_standins.install_missing_flash_attn()
        import deepspeed

        from openrlhf_sgrpo.openrlhf_ext.torch_adam import install_optimizer_choice

        _ASKED = _refuse_op_builds()
        install_optimizer_choice()  # what our PolicyModelActor does in its process
        deepspeed.init_distributed(dist_backend="gloo")
    return _ASKED


_ASKED: list[str] | None = None


def _actor_cfg(args: SimpleNamespace, scheduler_steps: int) -> dict:
    """The optimizer settings PolicyModelActor.init_model_from_pretrained hands strategy.prepare."""
    return dict(optim=args.actor.optim, muon=vars(args.actor.muon), adam=vars(args.actor.adam),
                lr_scheduler=args.actor.lr_scheduler, lr_warmup_ratio=args.actor.lr_warmup_ratio,
                min_lr_ratio=args.actor.min_lr_ratio, max_norm=args.actor.max_norm, scheduler_steps=scheduler_steps)


@check
def deepspeed_optimizer(out: Path) -> str:
    """The policy's DeepSpeed engine as OpenRLHF's strategy builds it, on DeepSpeed's CPU accelerator."""
    asked = _deepspeed_on_cpu()
    import torch
    from openrlhf.utils.utils import get_strategy

    results = {}
    for choice in ("torch_fused", "deepspeed"):
        args = smoke_args("B", out, ["--sgrpo.optimizer", choice], policy="unused-by-this-check")
        strategy = get_strategy(args)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 8))
        cfg = _actor_cfg(args, 2)
        before = len(asked)
        try:  # PolicyModelActor.init_model_from_pretrained's call
            engine, optim, _ = strategy.prepare((model, cfg))
        except RuntimeError as err:
            results[choice] = {"built": None, "op_builds": asked[before:], "error": str(err)[:200]}
            continue
        inner = optim.optimizer
        for _ in range(engine.gradient_accumulation_steps()):  # micro-batches up to one optimizer step
            loss = engine(torch.randn(4, 16, dtype=torch.bfloat16)).float().pow(2).mean()
            engine.backward(loss)
            engine.step()  # the last one steps the optimizer DeepSpeed built (ZeRO-2)
        results[choice] = {"built": f"{type(inner).__module__}.{type(inner).__name__}",
                           "fused": inner.defaults.get("fused"), "zero": type(optim).__name__,
                           "op_builds": asked[before:], "state": sorted(next(iter(inner.state.values())))}
    (out / "deepspeed_optimizer.json").write_text(json.dumps(results, indent=1))
    ours, control = results["torch_fused"], results["deepspeed"]
    if ours["built"] != "torch.optim.adamw.AdamW" or not ours["fused"] or ours["op_builds"]:
        raise RuntimeError(f"--sgrpo.optimizer torch_fused: {ours}")
    if not control["op_builds"]:
        raise RuntimeError(f"control: the default optimizer built without asking the op builder: {control}")
    return (f"torch_fused -> {ours['built']}(fused=True) under {ours['zero']}, no op build, one step taken; "
            f"default -> op builder asked for {control['op_builds']}")


@check
def policy_step(out: Path) -> str:
    """The smoke's policy (SmolLM2-135M) as the policy actor builds it: OpenRLHF's ``Actor`` with
    the run's attention and dtype (transformers of the image), ``strategy.prepare`` with
    ``--sgrpo.optimizer torch_fused`` under ZeRO-2, then two optimizer steps of action log-probs
    through ``strategy.backward`` / ``optimizer_step`` (DeepSpeed's CPU accelerator)."""
    asked = _deepspeed_on_cpu()
    import torch
    from openrlhf.models import Actor
    from openrlhf.utils.utils import get_strategy

    args = smoke_args("B", out)
    strategy = get_strategy(args)
    actor = Actor(args.actor.model_name_or_path, attn_implementation=args.ds.attn_implementation,
                  experts_implementation=args.ds.experts_implementation, param_dtype=args.ds.param_dtype,
                  load_in_4bit=args.ds.load_in_4bit, lora_rank=args.ds.lora.rank, lora_alpha=args.ds.lora.alpha,
                  target_modules=args.ds.lora.target_modules, lora_dropout=args.ds.lora.dropout,
                  ds_config=strategy.get_ds_train_config(), packing_samples=args.ds.packing_samples,
                  temperature=args.rollout.temperature, use_liger_kernel=args.ds.use_liger_kernel)
    before = len(asked)
    actor, optim, scheduler = strategy.prepare((actor, _actor_cfg(args, 2)))
    master = optim.single_partition_of_fp32_groups[0]  # ZeRO-2's fp32 weights, which the optimizer steps
    first = master.detach().clone()
    g = torch.Generator().manual_seed(0)
    # two optimizer steps: the scheduler's warm-up gives the first one lr 0
    for _ in range(2 * actor.model.gradient_accumulation_steps()):
        seq = torch.randint(0, 1000, (2, 24), generator=g)
        mask = torch.zeros(2, 23, dtype=torch.bool)
        mask[:, 12:] = True
        logp = actor(seq, action_mask=mask, attention_mask=torch.ones_like(seq))
        loss = -(logp * mask[:, -logp.shape[1]:]).sum() / mask.sum()
        strategy.backward(loss, actor, optim)
        strategy.optimizer_step(optim, actor, scheduler, name="actor")
    moved = (master.detach() - first).abs().max()
    inner = optim.optimizer
    if asked[before:] or type(inner).__name__ != "AdamW" or not inner.defaults.get("fused") or moved == 0:
        raise RuntimeError(f"op builds {asked[before:]}, optimizer {type(inner)}, max weight change {moved}")
    return (f"{type(actor.model.module).__name__} ({sum(p.numel() for p in actor.model.parameters()):,} parameters, "
            f"{args.ds.attn_implementation}, {args.ds.param_dtype}) took two optimizer steps with fused AdamW "
            f"(max weight change {float(moved):.2e}); nothing built")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="append", choices=list(CHECKS), help="run only these (default: all)")
    p.add_argument("--out", default=os.environ.get("REHEARSAL_OUT", "/tmp/gpu_rehearsal/out"))
    p.add_argument("--json", help="write {check: {ok, seconds, detail}} here")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {}
    for name in a.check or list(CHECKS):
        t0 = time.time()
        try:
            detail, ok = CHECKS[name](out), True
        except BaseException as err:  # noqa: BLE001 - every check runs; each failure is reported
            detail, ok = "".join(traceback.format_exception(err, limit=-6))[-4000:], False
        report[name] = {"ok": ok, "seconds": round(time.time() - t0, 1), "detail": detail}
        print(f"[rehearsal] {'PASS' if ok else 'FAIL'} {name} ({report[name]['seconds']} s): {detail}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0 if all(r["ok"] for r in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
