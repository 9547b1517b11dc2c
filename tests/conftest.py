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
