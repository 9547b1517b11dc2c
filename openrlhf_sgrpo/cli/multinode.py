"""What cannot work once a run spans more than one Ray node, refused at launch (issue #51).

On one host everything shares one loopback interface and one filesystem; across nodes neither is
shared. Two kinds of value then break silently, far from their cause:

- a tool URL on loopback (``127.0.0.0/8``, ``localhost``, ``::1``, ``0.0.0.0``): each node's
  agent would call a service on *its own* host (Search-R1 #165: one retriever per node, or none);
- a path something writes during the run, on a disk only one node has: the policy ranks write
  their DeepSpeed checkpoint shards under ``--ckpt.path`` on whichever node each landed, rank 0
  writes ``--ckpt.output_dir``, and OpenRLHF's ``PPOTrainer`` actor (placed by Ray on any node)
  writes TensorBoard logs and our rollout records, and decides whether to resume by looking for
  ``--ckpt.path/_actor`` on *its* node. So these must be on storage every node mounts at the same
  path, which only the user knows: ``--sgrpo.shared_fs DIR`` states it, and each such path must
  lie under one of those folders.

A run counts as multi-node when its flags say so (any ``--*.num_nodes`` above 1, as the launch
scripts pass ``NUM_NODES``) or, at launch, when the Ray cluster it joined has more than one alive
node (checked after ``ray.init``, before any actor starts).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from types import SimpleNamespace
from urllib.parse import urlsplit

from agent_env.config import AgentConfig

SHARED_FS_FLAG = "--sgrpo.shared_fs"
NUM_NODES_FLAGS = ("actor", "ref", "critic", "reward")
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def is_loopback_host(host: str | None) -> bool:
    """True for a host that names the machine itself, whichever machine resolves it."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def multinode_reason(args: SimpleNamespace, alive_nodes: int | None = None) -> str | None:
    """Why this run spans more than one node (a flag, or the cluster it joined), or None."""
    for group in NUM_NODES_FLAGS:
        n = getattr(getattr(args, group, None), "num_nodes", 1) or 1
        if n > 1:
            return f"--{group}.num_nodes {n}"
    if alive_nodes is not None and alive_nodes > 1:
        return f"the Ray cluster has {alive_nodes} alive nodes"
    return None


def tool_urls(config: AgentConfig | None, args: SimpleNamespace) -> list[tuple[str, str]]:
    """(name, URL) of every service the workers call: the agent's tools and a remote reward model."""
    urls = []
    if config is not None:
        if config.search_backend == "local":
            urls.append(("agent config retriever_url", config.retriever_url))
        else:
            urls.append(("agent config web_search_url", config.web_search_url))
        if config.sandbox_url and "code" in config.allowed_actions:  # only a template offering <code> calls it
            urls.append(("agent config sandbox_url", config.sandbox_url))
    remote = getattr(args.reward, "remote_url", None)
    for url in ([remote] if isinstance(remote, str) else list(remote or [])):
        if url and url != "agent":  # OpenRLHF's marker for "the agent gives the rewards"
            urls.append(("--reward.remote_url", url))
    return urls


def written_paths(args: SimpleNamespace) -> list[tuple[str, str, str]]:
    """(flag, path, who writes or reads it there) for every path the run's actors use on their node."""
    paths = [("--ckpt.output_dir", args.ckpt.output_dir,
              "the policy's rank 0 writes the final model there, on the node it landed on")]
    if args.ckpt.save_steps > 0 or args.ckpt.load_enable:
        paths.append(("--ckpt.path", args.ckpt.path,
                      "every policy rank writes its checkpoint shards there on its own node, and a resume "
                      "looks for them on the trainer's node and on every rank's"))
    if args.sgrpo.dump_rollouts > 0 and args.sgrpo.run_dir:
        paths.append(("--sgrpo.run_dir", args.sgrpo.run_dir,
                      "OpenRLHF's PPOTrainer actor writes the rollout records there, on whichever node Ray placed it"))
    if args.logger.tensorboard_dir:
        paths.append(("--logger.tensorboard_dir", args.logger.tensorboard_dir,
                      "OpenRLHF's PPOTrainer actor writes the TensorBoard logs there, on whichever node Ray placed it"))
    return [(flag, path, why) for flag, path, why in paths if path]


def _under(path: str, roots: Iterable[str]) -> bool:
    p = os.path.normpath(path)
    return any(p == os.path.normpath(r) or p.startswith(os.path.normpath(r).rstrip("/") + "/") for r in roots)


def multinode_errors(args: SimpleNamespace, config: AgentConfig | None, alive_nodes: int | None = None) -> list[str]:
    """Every value that cannot work across nodes, each message naming it; [] on one node."""
    reason = multinode_reason(args, alive_nodes)
    if reason is None:
        return []
    errors = [f"{name} {url!r} is a loopback address, but this run spans more than one node ({reason}): each "
              f"node would call its own host; point it at the one service every node reaches by name "
              f"(e.g. http://retriever:8000/retrieve, docs/multinode.md)"
              for name, url in tool_urls(config, args) if is_loopback_host(urlsplit(url).hostname)]
    shared = list(getattr(args.sgrpo, "shared_fs", None) or [])
    for flag, path, why in written_paths(args):
        if not os.path.isabs(path):
            errors.append(f"{flag} {path!r} is a relative path, but this run spans more than one node ({reason}): "
                          f"each node resolves it against its own working directory; {why}. Give a path under a "
                          f"folder every node mounts at the same path, named with {SHARED_FS_FLAG} DIR")
        elif not _under(path, shared):
            named = f"not under {SHARED_FS_FLAG} {' '.join(shared)}" if shared else f"no {SHARED_FS_FLAG} was given"
            errors.append(f"{flag} {path!r} is not on storage every node sees ({named}), but this run spans more "
                          f"than one node ({reason}): {why}. Put it under a folder every node mounts at the same "
                          f"path and say so with {SHARED_FS_FLAG} DIR")
    return errors
