"""Checkpoints that survive Ctrl-C: model, optimizer, RNG and trainer state, written atomically.

A checkpoint is a folder ``step_<k>`` written under a temporary name and renamed into place, so
an interrupted save never leaves a half-written "latest" checkpoint; ``latest`` is found by
scanning the folder names, not by a pointer file that could go stale.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import torch

STATE_FILE = "trainer_state.json"
WEIGHTS_FILE = "model.pt"
OPTIM_FILE = "optimizer.pt"
RNG_FILE = "rng.pt"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dirs(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and
             (p / STATE_FILE).exists()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: str | Path) -> Path | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


def save_checkpoint(root: str | Path, step: int, model, optimizer, state: dict, keep: int = 2) -> Path:
    """Write ``root/step_<step>`` atomically and keep the newest ``keep`` checkpoints."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(model.state_dict(), tmp / WEIGHTS_FILE)
    torch.save(optimizer.state_dict(), tmp / OPTIM_FILE)
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / RNG_FILE)
    (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in checkpoint_dirs(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | Path, model, optimizer) -> dict:
    """Restore weights, optimizer and RNG from a checkpoint folder; return its trainer state."""
    path = Path(path)
    if not (path / STATE_FILE).exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    model.load_state_dict(torch.load(path / WEIGHTS_FILE, map_location="cpu", weights_only=True))
    optimizer.load_state_dict(torch.load(path / OPTIM_FILE, map_location="cpu", weights_only=True))
    rng = torch.load(path / RNG_FILE, weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    return json.loads((path / STATE_FILE).read_text())
