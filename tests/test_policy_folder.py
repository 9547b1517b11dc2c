"""`policy_folder`: engines that load from disk (vLLM) get a plain HF folder for every --model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from openrlhf_sgrpo import assets
from openrlhf_sgrpo.local.models import load_policy, policy_folder


def test_embedded_model_is_saved_once_with_its_weights(tmp_path, monkeypatch):
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
