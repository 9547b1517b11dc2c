"""Imported at start-up by every Python process started with this folder on PYTHONPATH (the whole
test run under ``SGRPO_TEST_VLLM_GEMM``, see ``tests/conftest.py``; a test's own engine process).

One job: with ``SGRPO_TEST_VLLM_GEMM=amx``, vLLM's CPU GEMM dispatch as on a Xeon with AMX
(``openrlhf_sgrpo.testing.dispatch_gemm_as_on_amx``), set as vLLM's dispatch module is imported.
No import stand-ins here: those belong to the Ray cluster's site (``tests/ray_worker_site``), which
does the same where it is first on the path.
"""

from openrlhf_sgrpo.testing import install_vllm_gemm_choice

install_vllm_gemm_choice()
