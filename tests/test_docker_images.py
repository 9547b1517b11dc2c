"""The Docker image helpers' own rules, without an engine (tests/docker_images.py): which part of
the Dockerfile each stage is, and when the `train-deps` image CI keeps is built again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from docker_images import REPO, TRAIN_DEPS_INPUTS, stage_only, stage_text, train_deps_digest

CLOSURE = {"vllm-cpu": "0.29.0", "xgrammar": "0.2.1"}


def test_each_stage_is_its_own_lines_and_the_train_stage_needs_no_wheelhouse():
    dockerfile = (REPO / "Dockerfile").read_text()
    deps, train = stage_text(dockerfile, "train-deps"), stage_text(dockerfile, "train")
    assert deps.startswith("FROM ${TRAIN_BASE} AS train-deps\n") and "\nFROM " not in deps
    assert train.startswith("FROM ${TRAIN_DEPS_IMAGE} AS train\n") and "\nFROM " not in train
    assert "COPY examples/docker/wheelhouse/" in deps and "/tmp/wheelhouse" not in train  # no wheel sent again
    assert "install_vllm_cpu.sh" in deps and "--no-build-isolation -e ." in train
    assert stage_text(dockerfile, "tools").startswith("FROM ${TOOLS_BASE} AS tools\n")
    # every file the deps stage copies is in the digest's inputs (the wheelhouse is made from them)
    copied = [src for line in deps.splitlines() if line.startswith("COPY ") for src in line.split()[1:-1]]
    assert sorted(c for c in copied if "wheelhouse" not in c) == sorted(TRAIN_DEPS_INPUTS)


def test_a_stage_alone_keeps_the_global_args(tmp_path):
    shutil.copy2(REPO / "Dockerfile", tmp_path / "Dockerfile")
    text = stage_only(tmp_path, "train").read_text()
    assert "ARG TRAIN_DEPS_IMAGE=train-deps\n" in text and "AS tools\n" not in text
    assert text.count("\nFROM ") == 1
    deps = stage_only(tmp_path, "train-deps").read_text()  # a stage before another: its own lines only
    assert deps.count("\nFROM ") == 1 and "AS train\n" not in deps


@pytest.fixture()
def inputs(tmp_path) -> Path:
    for name in ["Dockerfile", "pyproject.toml", "README.md", *TRAIN_DEPS_INPUTS]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tmp_path / name)
    return tmp_path


def test_the_deps_digest_follows_what_the_stage_reads_and_nothing_else(inputs):
    digest = train_deps_digest(inputs, "sha256:base", CLOSURE)
    assert len(digest) == 16 and digest == train_deps_digest(inputs, "sha256:base", dict(reversed(CLOSURE.items())))
    (inputs / "README.md").write_text("changed")  # the train stage's, not the deps'
    dockerfile = inputs / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("COPY agent_env/ agent_env/", "COPY agent_env/ ./agent_env/"))
    assert train_deps_digest(inputs, "sha256:base", CLOSURE) == digest
    assert train_deps_digest(inputs, "sha256:other-base", CLOSURE) != digest
    assert train_deps_digest(inputs, "sha256:base", {**CLOSURE, "xgrammar": "0.2.2"}) != digest
    for name in TRAIN_DEPS_INPUTS:
        before = (inputs / name).read_bytes()
        (inputs / name).write_bytes(before + b"\n# one more line\n")
        assert train_deps_digest(inputs, "sha256:base", CLOSURE) != digest, name
        (inputs / name).write_bytes(before)
    dockerfile.write_text(dockerfile.read_text().replace("PIP_NO_CACHE_DIR=1\nWORKDIR", "PIP_NO_CACHE_DIR=0\nWORKDIR", 1))
    assert train_deps_digest(inputs, "sha256:base", CLOSURE) != digest


def test_a_deps_stage_without_the_build_backend_is_refused(inputs):
    dockerfile = inputs / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace('pip install "setuptools>=68"', "true"))
    with pytest.raises(AssertionError, match="setuptools>=68"):
        train_deps_digest(inputs, "sha256:base", CLOSURE)
