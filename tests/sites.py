"""The folders the tests put first on ``PYTHONPATH`` so that their ``sitecustomize`` runs in every
process a test starts (:func:`openrlhf_sgrpo.testing.pythonpath_led_by`): one place for both paths,
since conftest, the engine tests and the Ray cluster's set-up all need them."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
GEMM_SITE = HERE / "gemm_site"  # vLLM's GEMM dispatch as on an AMX Xeon, under SGRPO_TEST_VLLM_GEMM=amx
WORKER_SITE = HERE / "ray_worker_site"  # the Ray workers' import stand-ins for flash_attn
