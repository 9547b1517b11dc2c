"""``openrlhf_sgrpo.engine.weight_check``: the exact digests a weight-sync check compares, and the
Hugging Face -> vLLM name map, on CPU tensors and the tiny Qwen2 (tied and untied LM head).

The map is checked against ``tests/engine_probe.py::expected_engine_tensors`` (what the by-value
sync tests compare whole tensors with): the digest of each of its tensors, in the engine's form,
must be the digest the trainer side computes from the live model without building them."""

from __future__ import annotations

import pytest
import torch

from openrlhf_sgrpo.engine.weight_check import (
    DIGEST_ROW,
    as_engine_holds,
    differing,
    digest_parts,
    engine_sources,
    tensor_digest,
    vocab_padding,
)


def _values(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int8])
def test_equal_bytes_give_equal_digests_whatever_the_chunking(dtype):
    t = _values(DIGEST_ROW + 12346, torch.float32).mul(50).to(dtype)  # rows of DIGEST_ROW and a tail
    d = tensor_digest(t)
    assert d == tensor_digest(t.clone()) == tensor_digest(t.view(-1, 3))
    for chunk in (1000, DIGEST_ROW + 1, 1 << 30):
        assert tensor_digest(t, chunk=chunk) == d
    assert tensor_digest(t[:3000], chunk=1) == tensor_digest(t[:3000], chunk=7) == tensor_digest(t[:3000])
    # parts laid end to end = the concatenation (how fused q/k/v rows are digested without a copy)
    assert digest_parts([t[:17], t[17:40000], t[40000:]]) == d
    # a non-contiguous view digests its values in logical order, like its contiguous copy
    m = t[: 600 * 100].view(600, 100)
    assert tensor_digest(m.t()) == tensor_digest(m.t().contiguous())


def test_one_changed_element_a_swap_and_a_dtype_rounding_change_the_digest():
    t = _values(50_000, torch.bfloat16)
    d = tensor_digest(t)
    changed = t.clone()
    changed[31_337] = changed[31_337] * 2 + 1
    assert tensor_digest(changed) != d
    for i, j in [(0, 1), (5, 49_999), (1000, 1001)]:
        if t[i] == t[j]:
            continue
        swapped = t.clone()
        swapped[i], swapped[j] = t[j], t[i]
        assert tensor_digest(swapped) != d, (i, j)
    f = _values(10_000, torch.float32, seed=1)
    rounded = f.to(torch.bfloat16).float()
    assert not torch.equal(f, rounded) and tensor_digest(rounded) != tensor_digest(f)
    # the sign of zero and a NaN's payload are bytes too (torch.equal would call -0.0 equal)
    assert tensor_digest(torch.tensor([0.0])) != tensor_digest(torch.tensor([-0.0]))
    # order within a tensor and across parts counts
    assert digest_parts([t[:10], t[10:20]]) != digest_parts([t[10:20], t[:10]])


def test_digest_is_an_integer_of_62_bits_and_refuses_a_bad_chunk():
    d = tensor_digest(_values(1000, torch.bfloat16))
    assert isinstance(d, int) and 0 <= d < 2**63
    with pytest.raises(ValueError, match="chunk must be >= 1, got 0"):
        tensor_digest(torch.zeros(3), chunk=0)


def _tiny(tied: bool):
    from transformers import AutoModelForCausalLM

    from openrlhf_sgrpo import assets

    model, _ = assets.tiny_qwen2(seed=3)
    if tied:
        return model
    cfg = model.config
    cfg.tie_word_embeddings = False
    torch.manual_seed(4)
    return AutoModelForCausalLM.from_config(cfg)


# engine forms: bf16 everywhere (a GPU engine), fp32 (the biases vLLM's CPU build holds in fp32 on AMX)
@pytest.mark.parametrize("tied, engine_dtype", [(True, torch.bfloat16), (False, torch.float32)])
def test_name_map_matches_engine_probes_expected_tensors_on_tiny_qwen2(tied, engine_dtype):
    from engine_probe import expected_engine_tensors

    model = _tiny(tied)
    params = dict(model.named_parameters())
    sources = engine_sources(list(params))
    expected = expected_engine_tensors(model)
    # every vLLM name is one of engine_probe's, and the fused ones are its concatenations (rows, in order)
    assert "model.layers.0.self_attn.qkv_proj.weight" in sources and "model.layers.1.mlp.gate_up_proj.weight" in sources
    assert sources["model.layers.0.self_attn.qkv_proj.bias"] == [
        f"model.layers.0.self_attn.{p}_proj.bias" for p in "qkv"]
    assert not any(".q_proj." in n or ".gate_proj." in n or ".up_proj." in n for n in sources)
    assert sources["lm_head.weight"] == (["model.embed_tokens.weight"] if tied else ["lm_head.weight"])
    assert set(sources) <= set(expected)
    covered = {hf for parts in sources.values() for hf in parts}
    assert covered == set(params)  # every trainer tensor reaches some engine name
    for name, parts in sources.items():
        ours = digest_parts([as_engine_holds(params[p], engine_dtype) for p in parts])
        assert ours == tensor_digest(expected[name].to(engine_dtype)), name


def test_name_map_refuses_a_fused_group_with_a_part_missing():
    with pytest.raises(ValueError, match="v_proj"):
        engine_sources(["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"])


def test_differing_names_values_shapes_and_unmapped_tensors():
    engine = {"a": ((2,), "torch.bfloat16", 5), "b": ((2,), "torch.bfloat16", 6),
              "c": ((3,), "torch.bfloat16", 7), "d": ((1,), "torch.float32", 8)}
    trainer = {"a": ((2,), "torch.bfloat16", 5), "b": ((2,), "torch.bfloat16", 9), "c": ((4,), "torch.bfloat16", 7)}
    assert differing(engine, trainer) == ["b (values differ)", "c (shape (3,), trainer (4,))",
                                          "d (no trainer tensor maps to it)"]
    assert differing({"a": engine["a"]}, trainer) == []


def test_vocab_padding_only_for_embedding_and_head_rows():
    assert vocab_padding("model.embed_tokens.weight", (128, 8), 100) == 28
    assert vocab_padding("lm_head.weight", (100, 8), 100) == 0
    assert vocab_padding("model.norm.weight", (128,), 100) == 0
