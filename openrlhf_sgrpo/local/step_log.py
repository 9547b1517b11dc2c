"""The run's step log: one record per step to ``metrics.jsonl`` (always), TensorBoard (when
installed) and wandb (when configured). The paper's metrics themselves are computed in
:mod:`openrlhf_sgrpo.metrics`; this module only writes and reads records.

JSONL is the source of truth (the demo's report and the resume test read it); the other sinks
are views. wandb is used only when ``WANDB_API_KEY`` or ``WANDB_MODE`` is set, never by default,
so an offline machine never tries to reach it.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path


def _plain(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; None keeps the key visible
    return value


class StepLogger:
    """``log(step, metrics)`` appends one JSON line and mirrors scalars to TensorBoard/wandb."""

    def __init__(self, out_dir: str | Path, run_name: str = "sgrpo-local", config: dict | None = None,
                 tensorboard: bool = True, use_wandb: bool | None = None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.out_dir / "tensorboard"))
            except ImportError:  # tensorboard is optional at runtime
                self._tb = None
        if use_wandb is None:
            use_wandb = bool(os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE"))
        self._wandb = None
        if use_wandb:
            import wandb

            self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "openrlhf-sgrpo"), name=run_name,
                                     config=config or {}, dir=str(self.out_dir))

    def log(self, step: int, metrics: dict, phase: str = "train") -> dict:
        record = {"phase": phase, "step": step, "time": time.time(), **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        numeric = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k not in ("step", "time")}
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(f"{phase}/{k}", v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({f"{phase}/{k}": v for k, v in numeric.items()}, step=step)
        return record

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_step_log(path: str | Path, phase: str | None = None) -> list[dict]:
    """All records of a metrics.jsonl (optionally one phase), in file order."""
    path = Path(path)
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if phase is None or r.get("phase") == phase]
