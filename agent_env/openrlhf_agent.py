"""The file to pass as OpenRLHF's `--train.agent_func_path` (it defines nothing itself).

OpenRLHF 0.11.2 executes this file by path, in every vLLM engine actor, as a module named
``agent_module`` that it never puts in ``sys.modules`` (``vllm_engine._load_agent_executor``).
Code defined in such a module breaks in ways an ordinary import never shows: a ``@dataclass``
under postponed annotations looks its module up in ``sys.modules`` and crashes, and its
classes cannot be pickled by reference. So the executor lives in :mod:`agent_env.executor`,
imported the normal way, and this file only re-exports it.
"""

from agent_env.executor import AgentExecutor, AgentInstance

__all__ = ["AgentExecutor", "AgentInstance"]
