"""The demo's warm-up: what it teaches before RL, and the held-out evaluation right after it.

On the generated task the warm-up fits whole expert trajectories of *training* questions
(:mod:`.expert`): think, search the entity named in the question, read the observation, search
the bridge entity where the question needs it, answer with the name read. SmolLM2-135M never
writes the action tags on its own, so without it every reward would be 0. What it leaves to RL:
a few supervised steps on a few dozen demonstrations make a policy that has seen the moves but
not mastered them on new names (copying the right span, deciding on a second search, closing
with an answer); the held-out column "after warm-up" shows how far it got, "after RL" what the
RL steps added. On ``--data`` sets (no hop chain) it is the first-action format warm-up.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from openrlhf_sgrpo.demo.questions import DemoData


def demonstrations(args, data: DemoData, tok, prompt_fn: Callable[[str], str], make_rollout: Callable):
    """The expert trajectories the warm-up fits (None where the warm-up does not use them)."""
    from openrlhf_sgrpo.demo.expert import run_demonstrations
    from openrlhf_sgrpo.demo.synth_task import entity_names

    if data.task is None or args.warmup_steps == 0:
        return None
    demos = run_demonstrations(make_rollout, tok, list(data.task.train[: args.demos]), prompt_fn,
                               entity_names(data.task.heldout_pairs))
    print(demos.describe())
    if not demos.samples:
        raise ValueError("no expert demonstration scored: the retriever did not return the task's passages")
    return demos


def warm_up(args, model, tok, data: DemoData, demos, prompt_fn: Callable[[str], str] | None, logger) -> None:
    """Fit the expert trajectories (or, for --data, the first-action format pairs)."""
    from openrlhf_sgrpo.local.warmup import action_format_pairs, format_warmup, trajectory_warmup

    if demos is not None:
        loss = trajectory_warmup(model, tok, demos.samples, steps=args.warmup_steps, lr=args.warmup_lr,
                                 batch_size=args.warmup_batch, seed=args.seed, progress=True,
                                 micro_batch_size=args.warmup_micro_batch)
        logger.log(0, {"steps": args.warmup_steps, "final_loss": loss, "trajectories": len(demos.samples),
                       "weights": weights_fingerprint(model)}, phase="warmup")
        return
    if prompt_fn is None:
        pairs = action_format_pairs(data.train[:64])
    else:
        pairs = action_format_pairs(data.train[:64], prompt_fn=prompt_fn, query_fn=lambda q: q, sep="")
    loss = format_warmup(model, tok, data.train, steps=args.warmup_steps, lr=args.warmup_lr, pairs=pairs,
                         batch_size=args.warmup_batch, seed=args.seed, progress=True,
                         micro_batch_size=args.warmup_micro_batch)
    logger.log(0, {"steps": args.warmup_steps, "final_loss": loss, "pairs": len(pairs),
                   "weights": weights_fingerprint(model)}, phase="warmup")


def weights_fingerprint(model) -> str:
    """A short digest of the policy's weights (logged where each arm starts: equal digests, same
    starting policy)."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def save_warm_weights(model, path: Path) -> None:
    """The policy right after the warm-up: ``--compare`` starts every arm from it (also on resume)."""
    import torch

    tmp = path.with_suffix(".part")
    torch.save(model.state_dict(), tmp)
    tmp.replace(path)


def load_warm_weights(model, path: Path) -> None:
    import torch

    model.load_state_dict(torch.load(path, weights_only=True))
