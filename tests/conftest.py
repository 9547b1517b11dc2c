"""Shared test fixtures.

GPU-only imports: OpenRLHF's trainer modules import ``vllm`` and ``flash_attn`` at module
import time. On this CPU machine tests stub *only those imports* in ``sys.modules`` (as
OpenRLHF's own tests do) and then run the real OpenRLHF code paths. The stand-ins and the
seed shift (``SGRPO_TEST_SEED_SHIFT``) live in :mod:`openrlhf_sgrpo.testing`, shared with bench/.

``SGRPO_TEST_VLLM_GEMM=amx`` runs every vLLM engine the tests start with an AMX Xeon's GEMM
dispatch (:func:`openrlhf_sgrpo.testing.dispatch_gemm_as_on_amx`), on a processor with AVX-512 BF16.
"""

from __future__ import annotations

import os

import pytest
import time_budget
from sites import GEMM_SITE
from time_budget import (  # noqa: F401 - the suite's clock and each phase's CPU seconds (tests/time_budget.py)
    pytest_runtest_call,
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_runtest_teardown,
)

from openrlhf_sgrpo.testing import (  # noqa: F401
    GPU_ONLY_MODULES,
    install_gpu_import_stubs,
    pythonpath_led_by,
    vllm_gemm_choice,
)


def pytest_configure(config) -> None:
    """With ``SGRPO_TEST_VLLM_GEMM`` set, ``tests/gemm_site`` goes on ``PYTHONPATH`` before any
    process is started (xdist's workers, engines; the Ray cluster's own site does the same), so its
    sitecustomize sets vLLM's dispatch in each; a bad value stops the run here. An exported
    ``SGRPO_TOOLS_TOKEN`` is dropped before any service starts."""
    if vllm_gemm_choice():
        os.environ["PYTHONPATH"] = pythonpath_led_by(GEMM_SITE, os.environ.get("PYTHONPATH"))
    # A developer's exported tools token would make every service a test starts demand it, and
    # peers' clients (SandboxFusion's, Search-R1's) send none: the tests that need a token set it.
    os.environ.pop("SGRPO_TOOLS_TOKEN", None)


@pytest.fixture(scope="session")
def openrlhf_gpu_stubs() -> None:
    install_gpu_import_stubs()


def pytest_terminal_summary(terminalreporter) -> None:
    """The processor and its kernel ISAs beside the results (a terminal summary shows under ``-q``
    too, as CI runs it; a report header does not): torch and vLLM's CPU build pick different kernels
    on AVX2, AVX-512 and AMX machines, and CI's processor changes from run to run, so a failure
    report says which kernels it ran on."""
    import torch

    from openrlhf_sgrpo.engine import processor

    found = processor()
    gemm = "; vLLM GEMM dispatch: as on AMX (SGRPO_TEST_VLLM_GEMM=amx)" if vllm_gemm_choice() == "amx" else ""
    terminalreporter.write_line(f"processor: {found['processor']}; kernel ISAs: {found['cpu_isa']}; "
                                f"torch CPU capability: {torch.backends.cpu.get_cpu_capability()}{gemm}")
    time_budget.summary(terminalreporter)  # the suite's total, its slowest, modules past their budget
