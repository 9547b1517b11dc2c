"""The machine and versions a run's numbers come from, written beside its results.

The demo's ``environment.json`` and the study's ``study.json`` record it: times and, on a CPU,
bf16 rounding depend on the processor's kernels (:func:`openrlhf_sgrpo.engine.processor`).
"""

from __future__ import annotations

import os
import platform

from openrlhf_sgrpo.engine import processor


def environment() -> dict[str, str]:
    """Device and versions to record beside the table."""
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "machine": platform.machine(), "cpu_count": str(os.cpu_count())}
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name(0)
        env["cuda"] = str(torch.version.cuda)
    else:
        env["device"] = "cpu"
    env.update(processor())  # the kernels a CPU run's timings and bf16 rounding come from
    env["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    try:
        import vllm

        env["vllm"] = vllm.__version__
    except Exception:  # noqa: BLE001 - not installed or not importable here: recorded as absent
        env["vllm"] = "absent"
    return env
