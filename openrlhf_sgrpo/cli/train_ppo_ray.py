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
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agent_env.config import CONFIG_YAML_ENV, AgentConfig, ConfigError, config_from_yaml, config_source
from openrlhf_sgrpo.cli import worker_setup
from openrlhf_sgrpo.cli.flags import add_sgrpo_flags, validate_sgrpo_args
from openrlhf_sgrpo.cli.flags_extensions import sapo_inert_reason
from openrlhf_sgrpo.cli.multinode import multinode_errors
from openrlhf_sgrpo.openrlhf_ext.upstream_contract import MAIN_BLOCK_GLOBALS, main_block_violations

UPSTREAM_MODULE = "openrlhf.cli.train_ppo_ray"
# Forwarded to every Ray worker, with the same defaults OpenRLHF's train() uses.
_RAY_ENV_DEFAULTS = {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN", "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}
# SGRPO_AGENT_CONFIG: only the name of the file the driver read (the agent reads the content, which
# the CLI forwards as SGRPO_AGENT_CONFIG_YAML, see WorkerPayload). Never the Serper key:
# the workers search the web through retriever_server's /search proxy, which alone holds it.
# SGRPO_TOOLS_TOKEN: the tool services' shared token (their --auth-token-file's content), which the
# agent's clients send; by value, since a worker node has no file of the head's.
# vLLM's CPU build reads its KV-cache size and thread binding from the environment of its workers.
# VLLM_RPC_BASE_PATH: where each engine binds its ZeroMQ socket files, which vLLM never removes
# (/tmp by default: three per engine start); it must exist on every node.
_FORWARDED_ENV = ("SGRPO_AGENT_CONFIG", "SGRPO_TOOLS_TOKEN", "HF_HOME", "VLLM_CPU_KVCACHE_SPACE",
                  "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_RPC_BASE_PATH")


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


@dataclass(frozen=True)
class WorkerPayload:
    """What the driver reads at launch and sends to every Ray worker *by content*.

    Why: on a cluster the vLLM engine actors, which build the agent, sit on nodes that need not
    have the driver's files (issue #51: "agent config file ... does not exist" on a worker node).
    So the agent config ($SGRPO_AGENT_CONFIG) travels as YAML text, validated here first, and the
    file named by ``--train.agent_func_path`` as Python text that each worker writes to
    ``agent_path`` (:mod:`openrlhf_sgrpo.cli.worker_setup`), the path OpenRLHF is then given.
    """

    agent_config_yaml: str | None = None
    agent_config: AgentConfig | None = None
    agent_source: str | None = None
    agent_path: str | None = None  # where every worker writes agent_source

    def env_vars(self) -> dict[str, str]:
        env = {}
        if self.agent_config_yaml is not None:
            env[CONFIG_YAML_ENV] = self.agent_config_yaml
        if self.agent_source is not None and self.agent_path is not None:
            env[worker_setup.AGENT_SOURCE_ENV] = self.agent_source
            env[worker_setup.AGENT_PATH_ENV] = self.agent_path
        return env


def agent_config_at_launch() -> tuple[str, AgentConfig] | None:
    """The agent config this launch was given (content first, then the file), validated with the
    agent's own loader; CliError naming the file or variable. None: the agent's defaults."""
    try:
        source = config_source()
        return None if source is None else (source[0], config_from_yaml(*source))
    except ConfigError as exc:
        raise CliError(str(exc)) from exc


def agent_file_at_launch(path: str | None) -> tuple[str, str] | None:
    """(text, path on every node) of the ``--train.agent_func_path`` file, read on the driver's
    node; CliError naming it when it cannot be shipped."""
    if not path:
        return None
    p = Path(path).expanduser()
    if not p.is_file():
        raise CliError(f"--train.agent_func_path {path!r} does not exist on this node (the CLI reads it here and "
                       f"ships its content to every Ray node)")
    source = p.read_text()
    size = len(source.encode())
    if size > worker_setup.MAX_AGENT_SOURCE_BYTES:
        raise CliError(f"--train.agent_func_path {path!r} is {size} bytes; the CLI ships it to every Ray node in an "
                       f"environment variable (at most {worker_setup.MAX_AGENT_SOURCE_BYTES}): keep that file a "
                       f"few lines that import the agent from a package installed on every node (as "
                       f"agent_env/openrlhf_agent.py does)")
    return source, worker_setup.shipped_agent_path(source, p.name)


def worker_payload(agent_func_path: str | None = None) -> WorkerPayload:
    """Read and check, on the driver, everything the workers get by content (see WorkerPayload)."""
    config = agent_config_at_launch()
    agent = agent_file_at_launch(agent_func_path)
    return WorkerPayload(agent_config_yaml=config[0] if config else None, agent_config=config[1] if config else None,
                         agent_source=agent[0] if agent else None, agent_path=agent[1] if agent else None)


def ray_runtime_env(hf_engines: bool = False, payload: WorkerPayload | None = None) -> dict:
    """What every Ray worker gets: OpenRLHF's env defaults plus the agent's settings.

    No ``worker_process_setup_hook`` for our classes: it would run before Ray assigns GPUs (see
    :mod:`openrlhf_sgrpo.openrlhf_ext.actors`). The one hook puts import-only stand-ins for missing
    GPU-only modules in each worker, which touches no CUDA: ``flash_attn`` on every path (OpenRLHF
    imports it at module level; it has no wheel for every CUDA torch), ``vllm`` too with
    ``hf_engines`` (``--sgrpo.rollout_engine hf``); when ``payload`` ships an agent file, the hook
    is :mod:`openrlhf_sgrpo.cli.worker_setup`'s, which also writes that file. ``payload``'s
    contents travel as variables (:meth:`WorkerPayload.env_vars`), so a CLI started on a head
    node (not through ``ray job submit``) still configures every engine on every node, and
    ``TORCH_CUDA_ARCH_LIST`` in the form DeepSpeed parses (:func:`deepspeed_arch_list`).
    """
    env = {k: os.environ.get(k, v) for k, v in _RAY_ENV_DEFAULTS.items()}
    env.update({k: os.environ[k] for k in _FORWARDED_ENV if os.environ.get(k)})
    arch_list = deepspeed_arch_list(os.environ.get("TORCH_CUDA_ARCH_LIST"))
    if arch_list is not None:
        env["TORCH_CUDA_ARCH_LIST"] = arch_list
    hook_module = _STANDINS
    if payload is not None:
        env.update(payload.env_vars())
        if payload.agent_path is not None:
            hook_module = worker_setup.__name__
    return {"env_vars": env, "worker_process_setup_hook": f"{hook_module}.{_standin_installer(hf_engines)}"}


def connect_ray(hf_engines: bool = False, payload: WorkerPayload | None = None, **ray_init_kwargs: Any) -> None:
    """``ray.init`` with :func:`ray_runtime_env` unless Ray already runs in this process. Without
    ``payload``, the agent config of this process's environment is read, checked and forwarded by
    content (CliError naming a bad file). Starts no actor."""
    import ray

    if payload is None:
        payload = worker_payload()
    if not ray.is_initialized():
        ray.init(runtime_env=ray_runtime_env(hf_engines, payload), **ray_init_kwargs)


def start_ray(hf_engines: bool = False, payload: WorkerPayload | None = None, **ray_init_kwargs: Any) -> None:
    """:func:`connect_ray`, then our actor classes put where OpenRLHF's ``train()`` looks them up.
    Tests pass fake resources."""
    from openrlhf_sgrpo.openrlhf_ext.actors import install_actor_classes

    connect_ray(hf_engines, payload, **ray_init_kwargs)
    install_actor_classes(hf_engines)


def alive_nodes() -> int:
    """How many nodes the Ray cluster this process joined has alive now."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def launch_config(args: SimpleNamespace, payload: WorkerPayload) -> AgentConfig | None:
    """The agent config the engines will use: the one given, or the agent's defaults (loopback
    URLs) when an agent runs without one; None when no agent runs."""
    if payload.agent_config is not None:
        return payload.agent_config
    return AgentConfig() if args.train.agent_func_path else None


def refuse_unshared(args: SimpleNamespace, payload: WorkerPayload, nodes: int | None = None) -> None:
    """CliError listing every URL and path that cannot work across nodes (see
    :mod:`openrlhf_sgrpo.cli.multinode`); nothing on one node."""
    errors = multinode_errors(args, launch_config(args, payload), nodes)
    if errors:
        raise CliError("\n  ".join(["this run spans more than one node:", *errors]))


# The single-controller classes OpenRLHF's train() imports and creates with ``.remote(...)``.
TRAINER_CLASSES = (("openrlhf.trainer.ppo_trainer", "PPOTrainer"),
                   ("openrlhf.trainer.ppo_trainer_async", "PPOTrainerAsync"))


class PinnedActorClass:
    """An actor class whose ``.remote(...)`` creates the actor with ``scheduling_strategy``
    (every other attribute is the class's own)."""

    def __init__(self, cls: Any, scheduling_strategy: Any) -> None:
        self.cls, self.scheduling_strategy = cls, scheduling_strategy

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.cls.options(scheduling_strategy=self.scheduling_strategy).remote(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cls, name)


def pin_trainer_to_driver_node() -> dict[tuple[str, str], Any]:
    """Make the ``PPOTrainer`` (or ``PPOTrainerAsync``) actor that ``train()`` creates start on
    this process's node: a soft node affinity, so another node only when this one cannot host it
    (no CPU for it). Upstream gives it no resources and no node, so Ray may put it on any node, and
    with it the rollout records and TensorBoard files (docs/multinode.md, "What runs where").
    Returns what it replaced, for :func:`unpin_trainer`."""
    import importlib

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)
    replaced = {}
    for module, name in TRAINER_CLASSES:
        mod = importlib.import_module(module)
        cls = getattr(mod, name)
        replaced[(module, name)] = cls
        setattr(mod, name, PinnedActorClass(cls, strategy))
    return replaced


def unpin_trainer(replaced: dict[tuple[str, str], Any]) -> None:
    import importlib

    for (module, name), cls in replaced.items():
        setattr(importlib.import_module(module), name, cls)


def launch(args: SimpleNamespace, payload: WorkerPayload | None = None) -> None:
    """Check the installed OpenRLHF, start Ray with our actor classes, run OpenRLHF's train().
    The agent file OpenRLHF loads in each engine is the copy the workers write from ``payload``."""
    from openrlhf_sgrpo.openrlhf_ext import gpu_import_standins

    hf_engines = args.sgrpo.rollout_engine == "hf"
    getattr(gpu_import_standins, _standin_installer(hf_engines))()  # what every worker runs at start
    from openrlhf_sgrpo.openrlhf_ext.upstream_contract import contract_violations

    problems = contract_violations()
    if problems:
        raise CliError("the installed OpenRLHF does not match what openrlhf-sgrpo wires into "
                       "(pip install --no-deps openrlhf==0.11.2):\n  " + "\n  ".join(problems))
    if payload is None:
        payload = worker_payload(args.train.agent_func_path)
    refuse_unshared(args, payload)
    import ray

    ours = not ray.is_initialized()
    connect_ray(hf_engines, payload)
    try:  # the flags may say one node while the cluster has several: asked before any actor starts
        refuse_unshared(args, payload, alive_nodes())
    except CliError:
        if ours:
            ray.shutdown()
        raise
    if payload.agent_path is not None:
        args.train.agent_func_path = payload.agent_path
    start_ray(hf_engines, payload)
    from openrlhf.cli.train_ppo_ray import train

    from openrlhf_sgrpo.openrlhf_ext.vllm_engines import shutdown_engines

    pinned = pin_trainer_to_driver_node()
    try:
        train(args)
    finally:  # upstream leaves its engines to ray.shutdown, which strands their shared memory
        unpin_trainer(pinned)
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
    try:  # a bad agent file, a loopback URL or an unshared path on several nodes stops a dry run too
        payload = worker_payload(args.train.agent_func_path)
        refuse_unshared(args, payload)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(json.dumps(to_jsonable(args), indent=2, sort_keys=True))
        return 0
    try:
        launch(args, payload)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
