"""What tests/ and bench/ share (never imported by the runtime): GPU-import stand-ins and seeds.

GPU-only imports: OpenRLHF's trainer modules import ``vllm`` and ``flash_attn`` at module
import time. On a CPU machine the tests and the advantage bench put *import-only* stand-ins for
those modules in ``sys.modules`` (as OpenRLHF's own tests do; defined in
:mod:`openrlhf_sgrpo.openrlhf_ext.gpu_import_standins`) and then run the real OpenRLHF code paths.

vLLM's GEMM dispatch: ``SGRPO_TEST_VLLM_GEMM=amx`` makes vLLM's CPU build dispatch its Linears as
on a Xeon with AMX (:func:`dispatch_gemm_as_on_amx`), on any processor with AVX-512 BF16, which
its SGL kernels need. How weights are held, packed and reloaded is then the AMX machine's.

Seeds: sampled model output depends on the CPU's floating point, so no test may need a lucky
seed. ``SGRPO_TEST_SEED_SHIFT=k`` adds ``k`` to every seed the tests pass through
:func:`shifted_seed`, as a stand-in for another machine: a test that holds by construction passes
under every shift.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING

from openrlhf_sgrpo.openrlhf_ext.gpu_import_standins import GPU_ONLY_MODULES, VLLM_SAMPLING_DEFAULTS, install

if TYPE_CHECKING:
    import psutil

__all__ = ["GPU_ONLY_MODULES", "VLLM_SAMPLING_DEFAULTS", "after_import", "dispatch_gemm_as_on_amx",
           "install_gpu_import_stubs", "install_vllm_gemm_choice", "kill_left_over", "pythonpath_led_by", "seed_shift", "shifted_seed",
           "vllm_gemm_choice"]

SEED_SHIFT_ENV = "SGRPO_TEST_SEED_SHIFT"
GEMM_ENV = "SGRPO_TEST_VLLM_GEMM"
GEMM_CHOICES = ("", "amx")
# the vLLM module whose ``check_cpu_sgl_kernel`` picks, per Linear, the SGL kernels (AMX Xeons) or oneDNN
VLLM_GEMM_DISPATCH = "vllm.model_executor.layers.utils"


def install_gpu_import_stubs() -> None:
    """Put import-only stand-ins for vllm/flash_attn in sys.modules (idempotent)."""
    install(only_missing=True)


def pythonpath_led_by(folder: str | os.PathLike, pythonpath: str | None) -> str:
    """``pythonpath`` with ``folder`` first (once): a process started with it imports that folder's
    ``sitecustomize`` (the first one on the path wins), which is how the tests' sites reach every
    process they start (xdist workers, vLLM engines, Ray workers)."""
    first = os.fspath(folder)
    rest = [entry for entry in (pythonpath or "").split(os.pathsep) if entry and entry != first]
    return os.pathsep.join([first, *rest])


def seed_shift() -> int:
    """``$SGRPO_TEST_SEED_SHIFT`` as an int (0 when unset); a bad value is named."""
    raw = os.environ.get(SEED_SHIFT_ENV, "0").strip() or "0"
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{SEED_SHIFT_ENV} must be an integer, got {raw!r}") from None


def shifted_seed(base: int) -> int:
    """The seed a test uses for ``base``: shifted by ``$SGRPO_TEST_SEED_SHIFT``."""
    return base + seed_shift()


def vllm_gemm_choice() -> str:
    """``$SGRPO_TEST_VLLM_GEMM``: "" (the processor's own choice) or "amx"; a bad value is named."""
    raw = os.environ.get(GEMM_ENV, "").strip()
    if raw not in GEMM_CHOICES:
        raise ValueError(f"{GEMM_ENV} must be one of {GEMM_CHOICES}, got {raw!r}")
    return raw


def dispatch_gemm_as_on_amx(dispatch_module) -> None:
    """Make ``dispatch_module.check_cpu_sgl_kernel`` (vLLM's own rule, unchanged) answer as it does
    on a processor with AMX tiles: small bf16 Linear weights then go to the SGL kernels, whose
    set-up packs the weight and keeps the bias in fp32. Idempotent.

    Why: the weight-sync tests must hold on an AMX Xeon, and vLLM's CPU build takes that path only
    where ``torch.cpu._is_amx_tile_supported()``. The kernels run on AVX-512 BF16 without AMX
    tiles (their small-batch path is VDPBF16PS; larger batches go through oneDNN's brgemm, which
    picks the ISA there is), so only the answer to "AMX?" is changed, and only inside this check."""
    rule = dispatch_module.check_cpu_sgl_kernel
    if hasattr(rule, "__wrapped_rule__"):
        return

    def check_cpu_sgl_kernel(n: int, k: int, dtype):
        import torch

        real = torch.cpu._is_amx_tile_supported
        torch.cpu._is_amx_tile_supported = lambda: True
        try:
            return rule(n, k, dtype)
        finally:
            torch.cpu._is_amx_tile_supported = real

    check_cpu_sgl_kernel.__wrapped_rule__ = rule
    dispatch_module.check_cpu_sgl_kernel = check_cpu_sgl_kernel


def install_vllm_gemm_choice() -> None:
    """What the test sites' ``sitecustomize`` runs at a process's start: with
    ``SGRPO_TEST_VLLM_GEMM=amx``, vLLM's dispatch as on AMX once vLLM's dispatch module is imported."""
    if vllm_gemm_choice() == "amx":
        after_import(VLLM_GEMM_DISPATCH, dispatch_gemm_as_on_amx)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` right after ``import <name>`` finishes (before any user code uses it)."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then(module: ModuleType) -> None:
            exec_module(module)
            self.then(module)

        spec.loader.exec_module = exec_then
        return spec


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """``then(module)`` now if ``name`` is imported, else as soon as it is."""
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def kill_left_over(proc: subprocess.Popen, children: Iterable[psutil.Process]) -> None:
    """Kill ``proc`` (if still running) and the ``children`` it started, ignoring those already gone.

    Why: a test that signals an entry point and asserts its children exit must leave nothing behind
    when an assertion fails part-way; a vLLM engine core left under init holds gigabytes.
    """
    import psutil

    left = [*children, *([psutil.Process(proc.pid)] if proc.poll() is None else [])]
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
