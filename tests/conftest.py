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


# The modules that take longest, longest first (module totals with two workers on 2 cores,
# 2026-11-27: cluster options ~300 s, demo ~180, cluster Ray ~230, compose ~150, engines ~150,
# study ~130, train image ~120, sandbox isolation ~100, eval ~80). ``make test`` hands whole
# modules to its two workers (``--dist loadfile``) in collection order (``--no-loadscope-reorder``;
# xdist's own order, by test count, put the few-test long modules last: one worker then ran
# alone for the last ~3 min). The demo sits between the two Ray modules so that they do not
# start side by side. A stale entry costs minutes, never a result.
LONGEST_FIRST = ("test_cluster_options", "test_demo", "test_cluster_ray", "test_compose", "test_engines",
                 "test_study", "test_train_image", "test_sandbox_isolation", "test_eval", "test_tools_image",
                 "test_faults_local")


def pytest_collection_modifyitems(session, config, items) -> None:
    """The modules of :data:`LONGEST_FIRST` first, in that order; the rest as collected (a stable sort)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))
