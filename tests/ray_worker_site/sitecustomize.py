"""Imported at start-up by every Python process of the test's Ray cluster (it is on PYTHONPATH).

Three test-only jobs, none touching CUDA:
- the GPU-only import stubs of ``openrlhf_sgrpo/testing.py`` (``vllm``, ``flash_attn``), which cannot
  cross process borders any other way;
- a recorder of every ``torch.cuda`` device probe with the ``CUDA_VISIBLE_DEVICES`` value it saw,
  so a test can tell a probe made before Ray assigned the process its GPUs (the bug of a worker
  setup hook) from one made after. Read it with ``import sitecustomize; sitecustomize.CUDA_PROBES``;
- with ``SGRPO_TEST_VLLM_GEMM=amx``, vLLM's CPU GEMM dispatch as on a Xeon with AMX
  (``openrlhf_sgrpo.testing.dispatch_gemm_as_on_amx``), as ``tests/gemm_site`` sets it elsewhere.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

PROBE_FUNCTIONS = ("device_count", "is_available", "current_device", "set_device", "get_device_properties",
                   "get_device_name", "mem_get_info", "synchronize", "init", "_lazy_init")
CUDA_PROBES: list[tuple[str, str | None]] = []


def _instrument(cuda) -> None:
    for name in PROBE_FUNCTIONS:
        fn = getattr(cuda, name, None)
        if fn is None:
            continue

        @functools.wraps(fn)
        def probe(*args, _fn=fn, _name=name, **kwargs):
            CUDA_PROBES.append((_name, os.environ.get("CUDA_VISIBLE_DEVICES")))
            return _fn(*args, **kwargs)

        setattr(cuda, name, probe)


def _install() -> None:
    # By file location: sitecustomize runs before the worker's sys.path holds the repository.
    stubs = Path(__file__).resolve().parents[2] / "openrlhf_sgrpo" / "testing.py"
    spec = importlib.util.spec_from_file_location("_sgrpo_test_stubs", stubs)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install_gpu_import_stubs()
    module.after_import("torch", lambda torch: _instrument(torch.cuda))
    module.install_vllm_gemm_choice()


_install()
