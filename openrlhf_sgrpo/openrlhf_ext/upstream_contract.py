"""Every OpenRLHF 0.11.2 name our wiring relies on, in one place, checked against the installed copy.

The CLI runs OpenRLHF's own ``__main__`` block and ``train()``; our actor classes replace names
that upstream code resolves *at call time* (a module global read inside a function). If an
upgrade renames a class, or a function stops reading a name we replace, our code would be
bypassed silently. :func:`contract_violations` says so instead: the CLI refuses to launch and a
test fails, naming each broken item.
"""

from __future__ import annotations

import builtins
import dis
import importlib
import types
from dataclasses import dataclass

# The globals our CLI provides when it executes OpenRLHF's ``if __name__ == "__main__":`` block
# of ``openrlhf/cli/train_ppo_ray.py``; ``argparse`` (our parser) and ``train`` (ours) must be read.
MAIN_BLOCK_GLOBALS = frozenset({"argparse", "os", "datetime", "train"})
MAIN_BLOCK_MUST_READ = frozenset({"argparse", "train"})


@dataclass(frozen=True)
class UpstreamName:
    """``module.qualname`` must exist; if ``reads`` is set, its code must read those global names."""

    module: str
    qualname: str
    reads: tuple[str, ...] = ()
    why: str = ""


CONTRACT: tuple[UpstreamName, ...] = (
    UpstreamName("openrlhf.cli.train_ppo_ray", "train",
                 ("PolicyModelActor", "PPOTrainer", "PPOTrainerAsync", "create_vllm_engines"),
                 "our CLI calls it after replacing the actor classes (and, for --sgrpo.rollout_engine hf, "
                 "the engine factory) it uses"),
    UpstreamName("openrlhf.trainer.ppo_trainer", "PPOTrainer", why="subclassed: our experience maker"),
    UpstreamName("openrlhf.trainer.ppo_trainer", "BasePPOTrainer.__init__",
                 why="builds self.experience_maker, which our trainers replace"),
    UpstreamName("openrlhf.trainer.ppo_trainer_async", "PPOTrainerAsync.__init__", ("TrainingActor",),
                 "builds the training actor by that global name in its own process"),
    UpstreamName("openrlhf.trainer.ppo_trainer_async", "TrainingActor", why="subclassed: our experience maker"),
    UpstreamName("openrlhf.trainer.ray.ppo_actor", "PolicyModelActor.init_model_from_pretrained",
                 ("ActorPPOTrainer",), "builds the actor trainer our SAPO patch wraps"),
    UpstreamName("openrlhf.trainer.ray.ppo_actor", "ActorPPOTrainer.training_step",
                 why="wrapped by SAPO: calls self.actor_loss_fn and returns status['metrics']"),
    UpstreamName("openrlhf.trainer.ppo_utils.experience_maker", "RemoteExperienceMaker.compute_advantages_and_returns",
                 why="the override point of the stratified estimators"),
    UpstreamName("openrlhf.trainer.ppo_utils.experience_maker", "RemoteExperienceMaker.get_cumulative_returns"),
    UpstreamName("openrlhf.trainer.ppo_utils.length_penalty", "apply_length_penalties"),
    UpstreamName("openrlhf.models.utils", "compute_reward"),
    UpstreamName("openrlhf.models", "aggregate_loss", why="SAPO aggregates like the policy loss"),
    UpstreamName("openrlhf.trainer.ray.vllm_engine", "_load_agent_executor",
                 why="how every engine loads --train.agent_func_path (agent_env/openrlhf_agent.py)"),
    UpstreamName("openrlhf.trainer.ray.vllm_engine", "RolloutRayActor",
                 why="the engine interface HFRolloutActor serves (generate_responses, get_num_unfinished_requests)"),
    UpstreamName("openrlhf.utils.deepspeed.deepspeed", "DeepspeedStrategy._ds_init_train_model",
                 ("get_ds_train_config",), "builds the training config through the method --sgrpo.optimizer wraps"),
    UpstreamName("openrlhf.utils.agent", "MultiTurnAgentExecutor", why="base of agent_env.executor.AgentExecutor"),
)


def _resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
        obj = getattr(obj, "__ray_actor_class__", obj)  # look through @ray.remote
    return obj


def contract_violations(contract: tuple[UpstreamName, ...] = CONTRACT) -> list[str]:
    """One message per broken item (empty when the installed OpenRLHF matches)."""
    problems = []
    for item in contract:
        where = f"{item.module}.{item.qualname}"
        try:
            obj = _resolve(item.module, item.qualname)
        except (ImportError, AttributeError) as err:
            problems.append(f"{where} is missing ({err}); {item.why or 'openrlhf-sgrpo needs it'}")
            continue
        code = getattr(obj, "__code__", None)
        missing = [name for name in item.reads if code is None or name not in code.co_names]
        if missing:
            problems.append(f"{where} no longer reads {missing}: our replacement would be bypassed ({item.why})")
    return problems


def _free_globals(code: types.CodeType) -> set[str]:
    """Names a code object (and its nested code) loads but never stores: what its globals must hold."""
    loaded, stored = set(), set()
    stack = [code]
    while stack:
        c = stack.pop()
        for ins in dis.get_instructions(c):
            if ins.opname in ("LOAD_NAME", "LOAD_GLOBAL"):
                loaded.add(ins.argval)
            elif ins.opname in ("STORE_NAME", "STORE_GLOBAL", "IMPORT_NAME"):
                stored.add(ins.argval.split(".")[0] if ins.opname == "IMPORT_NAME" else ins.argval)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return {n for n in loaded - stored if not hasattr(builtins, n)}


def main_block_violations(code: types.CodeType) -> list[str]:
    """What is wrong with running OpenRLHF's ``__main__`` block with :data:`MAIN_BLOCK_GLOBALS`."""
    reads = _free_globals(code)
    problems = []
    if reads - MAIN_BLOCK_GLOBALS:
        problems.append(f"OpenRLHF's train_ppo_ray __main__ block now reads {sorted(reads - MAIN_BLOCK_GLOBALS)}, "
                        f"which our CLI does not provide")
    if MAIN_BLOCK_MUST_READ - reads:
        problems.append(f"OpenRLHF's train_ppo_ray __main__ block no longer reads {sorted(MAIN_BLOCK_MUST_READ - reads)}: "
                        f"our flags or our train() would be bypassed")
    return problems
