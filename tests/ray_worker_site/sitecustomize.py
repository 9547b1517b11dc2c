"""Imported at start-up by every Python process of the test's Ray cluster (it is on PYTHONPATH).

Two test-only jobs, neither touching CUDA:
- the GPU-only import stubs of ``tests/conftest.py`` (``vllm``, ``flash_attn``), which cannot
  cross process borders any other way;
- a recorder of every ``torch.cuda`` device probe with the ``CUDA_VISIBLE_DEVICES`` value it saw,
  so a test can tell a probe made before Ray assigned the process its GPUs (the bug of a worker
  setup hook) from one made after. Read it with ``import sitecustomize; sitecustomize.CUDA_PROBES``.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
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


class _InstrumentTorchOnImport(importlib.abc.MetaPathFinder):
    """Wraps ``torch.cuda``'s probes right after ``import torch`` finishes (before any user code)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_instrument(module):
            exec_module(module)
            _instrument(module.cuda)

        spec.loader.exec_module = exec_then_instrument
        return spec


def _install() -> None:
    conftest = Path(__file__).resolve().parent.parent / "conftest.py"
    spec = importlib.util.spec_from_file_location("_sgrpo_test_conftest", conftest)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install_gpu_import_stubs()
    if "torch" in sys.modules:
        _instrument(sys.modules["torch"].cuda)
    else:
        sys.meta_path.insert(0, _InstrumentTorchOnImport())


_install()
