"""The test sites reach a process only from the front of its ``PYTHONPATH``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sites import GEMM_SITE, WORKER_SITE

from openrlhf_sgrpo.testing import pythonpath_led_by


def test_a_site_goes_first_on_pythonpath_once():
    """The first ``sitecustomize`` on the path is the one a process runs, so a test site must lead
    the path, and putting it there twice must not grow it."""
    sep = os.pathsep
    assert pythonpath_led_by(GEMM_SITE, None) == str(GEMM_SITE)
    assert pythonpath_led_by(GEMM_SITE, "") == str(GEMM_SITE)
    assert pythonpath_led_by(GEMM_SITE, f"/a{sep}{GEMM_SITE}{sep}/b") == f"{GEMM_SITE}{sep}/a{sep}/b"
    once = pythonpath_led_by(GEMM_SITE, "/a")
    assert pythonpath_led_by(GEMM_SITE, once) == once == f"{GEMM_SITE}{sep}/a"


@pytest.mark.parametrize("site", [GEMM_SITE, WORKER_SITE], ids=["gemm", "ray_worker"])
def test_a_process_started_with_a_site_first_runs_its_sitecustomize(site):
    """Each site's ``sitecustomize`` is the one a child process imports."""
    env = {**os.environ, "PYTHONPATH": pythonpath_led_by(site, os.environ.get("PYTHONPATH"))}
    out = subprocess.run([sys.executable, "-c", "import sitecustomize; print(sitecustomize.__file__)"],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == str(site / "sitecustomize.py")
