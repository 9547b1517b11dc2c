"""What every Ray worker process runs when it starts (the runtime_env's ``worker_process_setup_hook``).

Two jobs, both free of CUDA (the hook runs before Ray assigns GPUs, see
:mod:`openrlhf_sgrpo.openrlhf_ext.actors`):

1. the import stand-ins of :mod:`openrlhf_sgrpo.openrlhf_ext.gpu_import_standins`;
2. the agent file, by content. OpenRLHF 0.11.2 loads ``--train.agent_func_path`` *by path* in
   every vLLM engine actor (``vllm_engine._load_agent_executor``), and on a cluster that actor
   sits on a node that need not have the driver's files. The CLI reads the file at launch, puts
   its text in ``$SGRPO_AGENT_FUNC_SOURCE`` and a content-addressed path in
   ``$SGRPO_AGENT_FUNC_PATH`` (the path it hands OpenRLHF instead), and each worker writes the
   text there before any actor runs. The file is written by the workers only, never by the
   driver, so a test can tell the shipped copy from the original.

The module imports nothing heavy: it is imported in every worker of the job.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

AGENT_SOURCE_ENV = "SGRPO_AGENT_FUNC_SOURCE"
AGENT_PATH_ENV = "SGRPO_AGENT_FUNC_PATH"
# Where the shipped agent file goes on every node: /tmp exists on every Linux node, and the
# folder is named by the content's hash, so runs with different files never share one.
SHIPPED_AGENT_ROOT = "/tmp"
# An environment variable holds the text; Linux caps one variable at 128 KiB (MAX_ARG_STRLEN).
MAX_AGENT_SOURCE_BYTES = 100_000


def shipped_agent_path(source: str, name: str) -> str:
    """The path the agent file with this text gets on every node (same string everywhere)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    return os.path.join(SHIPPED_AGENT_ROOT, f"sgrpo-agent-{digest}", name)


def materialize_agent_file() -> str | None:
    """Write ``$SGRPO_AGENT_FUNC_SOURCE`` to ``$SGRPO_AGENT_FUNC_PATH`` unless it is there already
    with that text; atomic (a rename), since every worker process of a node runs this at once.
    Returns the path written or found, None when the job ships no agent file."""
    source, path = os.environ.get(AGENT_SOURCE_ENV), os.environ.get(AGENT_PATH_ENV)
    if not source or not path:
        return None
    target = Path(path)
    if target.is_file() and target.read_text() == source:
        return path
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(source)
    os.replace(tmp, target)
    return path


def install_missing() -> None:
    """``--sgrpo.rollout_engine hf``: stand-ins for vLLM (where missing) and flash-attn, then the agent file."""
    from openrlhf_sgrpo.openrlhf_ext import gpu_import_standins

    gpu_import_standins.install_missing()
    materialize_agent_file()


def install_missing_flash_attn() -> None:
    """The vLLM path: a stand-in for flash-attn only, then the agent file."""
    from openrlhf_sgrpo.openrlhf_ext import gpu_import_standins

    gpu_import_standins.install_missing_flash_attn()
    materialize_agent_file()
