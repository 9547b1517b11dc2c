"""Shared test fixtures.

GPU-only imports: OpenRLHF's trainer modules import ``vllm`` and ``flash_attn`` at module
import time. On this CPU machine tests stub *only those imports* in ``sys.modules`` (as
OpenRLHF's own tests do) and then run the real OpenRLHF code paths. The stand-ins and the
seed shift (``SGRPO_TEST_SEED_SHIFT``) live in :mod:`openrlhf_sgrpo.testing`, shared with bench/.
"""

from __future__ import annotations

import pytest

from openrlhf_sgrpo.testing import GPU_ONLY_MODULES, install_gpu_import_stubs  # noqa: F401 (re-exported)


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
    terminalreporter.write_line(f"processor: {found['processor']}; kernel ISAs: {found['cpu_isa']}; "
                                f"torch CPU capability: {torch.backends.cpu.get_cpu_capability()}")
