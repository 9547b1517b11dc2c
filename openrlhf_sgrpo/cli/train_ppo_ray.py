"""``python -m openrlhf_sgrpo.cli.train_ppo_ray``: OpenRLHF 0.11.2's PPO/GRPO entry point + ours.

OpenRLHF builds its parser inside ``if __name__ == "__main__":`` of
``openrlhf/cli/train_ppo_ray.py``, so it cannot be imported. We run exactly that block from
the installed package (every flag, default and validation unchanged), with two substitutions:
the parser class also adds our flags, and ``train`` is ours: it validates our options, prints
the config for ``--dry_run``, or puts our actor classes where OpenRLHF's ``train`` looks them
up (:mod:`openrlhf_sgrpo.openrlhf_ext.actors`) and calls it. The upstream names this relies on
are listed and checked in :mod:`openrlhf_sgrpo.openrlhf_ext.upstream_contract`. The block needs neither Ray nor vLLM, so ``--dry_run`` works
on a CPU machine.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.util
import json
import os
import re
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from openrlhf_sgrpo.cli.flags import add_sgrpo_flags, validate_sgrpo_args
from openrlhf_sgrpo.cli.flags_extensions import sapo_inert_reason
from openrlhf_sgrpo.openrlhf_ext.upstream_contract import MAIN_BLOCK_GLOBALS, main_block_violations

UPSTREAM_MODULE = "openrlhf.cli.train_ppo_ray"
# Forwarded to every Ray worker, with the same defaults OpenRLHF's train() uses.
_RAY_ENV_DEFAULTS = {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN", "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}
# Read by the agent inside the engine actors (agent_env.config.CONFIG_ENV). Never the Serper key:
# the workers search the web through retriever_server's /search proxy, which alone holds it.
# vLLM's CPU build reads its KV-cache size and thread binding from the environment of its workers.
# VLLM_RPC_BASE_PATH: where each engine binds its ZeroMQ socket files, which vLLM never removes
# (/tmp by default: three per engine start); it must exist on every node.
_FORWARDED_ENV = ("SGRPO_AGENT_CONFIG", "HF_HOME", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
                  "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_RPC_BASE_PATH")


class CliError(Exception):
    """A bad command line: printed as `error: ...` with exit code 2."""


class _SGRPOArgumentParser(argparse.ArgumentParser):
    """OpenRLHF's parser, plus our flags registered just before parsing."""

    def parse_args(self, args=None, namespace=None):
        add_sgrpo_flags(self)
        return super().parse_args(args, namespace)


def _upstream_main_block() -> types.CodeType:
    """Compile the body of OpenRLHF's ``if __name__ == "__main__":`` block."""
    spec = importlib.util.find_spec(UPSTREAM_MODULE)
    if spec is None or spec.origin is None:
        raise CliError(f"{UPSTREAM_MODULE} not found: pip install --no-deps openrlhf==0.11.2")
    path = Path(spec.origin)
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"):
            code = compile(ast.Module(body=node.body, type_ignores=[]), str(path), "exec")
            problems = main_block_violations(code)
            if problems:
                raise CliError("; ".join(problems) + " (pip install --no-deps openrlhf==0.11.2)")
            return code
    raise CliError(f"no __main__ block in {path}: unsupported OpenRLHF version")


def _argparse_with_our_parser() -> types.ModuleType:
    shim = types.ModuleType("argparse")
    shim.__dict__.update(argparse.__dict__)
    shim.ArgumentParser = _SGRPOArgumentParser
    return shim


def to_jsonable(obj: Any) -> Any:
    if isinstance(obj, SimpleNamespace):
        return {k: to_jsonable(v) for k, v in vars(obj).items()}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return str(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def deepspeed_arch_list(value: str | None) -> str | None:
    """``TORCH_CUDA_ARCH_LIST`` in the form DeepSpeed 0.19.6's JIT op builder parses, or None when
    it needs no change.

    DeepSpeed reads each entry as ``MAJOR.MINOR[+PTX]`` with ``int()``; an arch-specific suffix
    (``9.0a``, ``10.0f``), which NVIDIA's images and the lent H200 machine set, raises ValueError
    in the policy actor when FusedAdam compiles. The suffix only lets nvcc use arch-specific
    instructions, which FusedAdam does not need, so each entry keeps its numbers and ``+PTX``."""
    if not value:
        return None
    entries = [e for e in re.split(r"[;\s]+", value.strip()) if e]
    fixed = [re.sub(r"^(\d+\.\d+)[A-Za-z]+", r"\1", e) for e in entries]
    return ";".join(fixed) if fixed != entries else None


_STANDINS = "openrlhf_sgrpo.openrlhf_ext.gpu_import_standins"


def _standin_installer(hf_engines: bool) -> str:
    """The stand-in installer the driver and every Ray worker run: vllm is stood in for only where
    the HF engine replaces it (the vLLM rollout needs the real engine); flash_attn always."""
    return "install_missing" if hf_engines else "install_missing_flash_attn"


def ray_runtime_env(hf_engines: bool = False) -> dict:
    """What every Ray worker gets: OpenRLHF's env defaults plus the agent's settings.

    No ``worker_process_setup_hook`` for our classes: it would run before Ray assigns GPUs (see
    :mod:`openrlhf_sgrpo.openrlhf_ext.actors`). The one hook puts import-only stand-ins for missing
    GPU-only modules in each worker, which touches no CUDA: ``flash_attn`` on every path (OpenRLHF
    imports it at module level; it has no wheel for every CUDA torch), ``vllm`` too with
    ``hf_engines`` (``--sgrpo.rollout_engine hf``). The agent's variables are forwarded so a CLI
    started on a head node (not through ``ray job submit``) still configures every engine, and
    ``TORCH_CUDA_ARCH_LIST`` in the form DeepSpeed parses (:func:`deepspeed_arch_list`).
    """
    env = {k: os.environ.get(k, v) for k, v in _RAY_ENV_DEFAULTS.items()}
    env.update({k: os.environ[k] for k in _FORWARDED_ENV if os.environ.get(k)})
    arch_list = deepspeed_arch_list(os.environ.get("TORCH_CUDA_ARCH_LIST"))
    if arch_list is not None:
        env["TORCH_CUDA_ARCH_LIST"] = arch_list
    return {"env_vars": env, "worker_process_setup_hook": f"{_STANDINS}.{_standin_installer(hf_engines)}"}


def start_ray(hf_engines: bool = False, **ray_init_kwargs: Any) -> None:
    """``ray.init`` with :func:`ray_runtime_env` (unless Ray already runs in this process), then
    our actor classes put where OpenRLHF's ``train()`` looks them up. Tests pass fake resources."""
    import ray

    from openrlhf_sgrpo.openrlhf_ext.actors import install_actor_classes

    if not ray.is_initialized():
        ray.init(runtime_env=ray_runtime_env(hf_engines), **ray_init_kwargs)
    install_actor_classes(hf_engines)


def launch(args: SimpleNamespace) -> None:
    """Check the installed OpenRLHF, start Ray with our actor classes, run OpenRLHF's train()."""
    from openrlhf_sgrpo.openrlhf_ext import gpu_import_standins

    hf_engines = args.sgrpo.rollout_engine == "hf"
    getattr(gpu_import_standins, _standin_installer(hf_engines))()  # what every worker runs at start
    from openrlhf_sgrpo.openrlhf_ext.upstream_contract import contract_violations

    problems = contract_violations()
    if problems:
        raise CliError("the installed OpenRLHF does not match what openrlhf-sgrpo wires into "
                       "(pip install --no-deps openrlhf==0.11.2):\n  " + "\n  ".join(problems))
    start_ray(hf_engines)
    from openrlhf.cli.train_ppo_ray import train

    from openrlhf_sgrpo.openrlhf_ext.vllm_engines import shutdown_engines

    try:
        train(args)
    finally:  # upstream leaves its engines to ray.shutdown, which strands their shared memory
        if not hf_engines:
            shutdown_engines()


def parse_config(argv: list[str]) -> SimpleNamespace:
    """OpenRLHF's parse + hierarchize + validation, plus ours; raises CliError on bad values."""
    captured: list[SimpleNamespace] = []
    saved_argv = sys.argv
    sys.argv = [saved_argv[0] if saved_argv else "train_ppo_ray", *argv]
    namespace = {"__name__": "__main__", "argparse": _argparse_with_our_parser(), "os": os,
                 "datetime": datetime.datetime, "train": captured.append}
    assert set(namespace) - {"__name__"} == MAIN_BLOCK_GLOBALS
    try:
        exec(_upstream_main_block(), namespace)  # noqa: S102 - OpenRLHF's own, installed source
    except AssertionError as exc:
        raise CliError(str(exc)) from exc
    finally:
        sys.argv = saved_argv
    args = captured[0]
    errors = validate_sgrpo_args(args)
    if errors:
        raise CliError("; ".join(errors))
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_config(sys.argv[1:] if argv is None else argv)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    inert = sapo_inert_reason(args)
    if inert:
        print(f"warning: {inert}", file=sys.stderr)
    if args.dry_run:
        print(json.dumps(to_jsonable(args), indent=2, sort_keys=True))
        return 0
    try:
        launch(args)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
