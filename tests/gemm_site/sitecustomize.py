"""Imported at start-up by every Python process started with this folder on PYTHONPATH (the whole
test run under ``SGRPO_TEST_VLLM_GEMM``, see ``tests/conftest.py``; a test's own engine process).

One job: with ``SGRPO_TEST_VLLM_GEMM=amx``, vLLM's CPU GEMM dispatch as on a Xeon with AMX
(``openrlhf_sgrpo.testing.dispatch_gemm_as_on_amx``), set as vLLM's dispatch module is imported.
No import stand-ins here: those belong to the Ray cluster's site (``tests/ray_worker_site``), which
does the same where it is first on the path.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def _install() -> None:
    # By file location, as the Ray site does: the repository need not be on sys.path yet.
    testing = Path(__file__).resolve().parents[2] / "openrlhf_sgrpo" / "testing.py"
    spec = importlib.util.spec_from_file_location("_sgrpo_test_gemm", testing)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install_vllm_gemm_choice()


_install()
