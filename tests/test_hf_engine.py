"""The local HF generation engine against the real tiny Qwen2 (random weights, real tokenizer)."""

import asyncio

import pytest
import torch

from openrlhf_sgrpo import assets
from openrlhf_sgrpo.local.hf_engine import HFGenerationEngine
from openrlhf_sgrpo.local.sampling import SamplingParams


@pytest.fixture(scope="module")
def tiny():
    return assets.tiny_qwen2(seed=1)


PROMPTS = ["Question: what is the capital of France?", "Hi", "<think>one two three four five six</think>"]


def generate_all(engine, prompts, params):
    async def main():
        return await asyncio.gather(*[engine.generate(p, params) for p in prompts])
    return asyncio.run(main())


def ids(tok, texts):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_greedy_batched_matches_unbatched_hf_generate(tiny):
    model, tok = tiny
    engine = HFGenerationEngine(model, tok, max_batch=8)
    outs = generate_all(engine, ids(tok, PROMPTS), SamplingParams(temperature=0.0, max_tokens=10))
    assert engine.batches_run == 1
    for p, out in zip(ids(tok, PROMPTS), outs):
        with torch.inference_mode():
            ref = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=10, do_sample=False)[0, len(p):].tolist()
        assert out.outputs[0].token_ids == ref
        assert out.outputs[0].finish_reason == "length"


def test_stop_string_ends_generation_and_is_kept_in_text(tiny):
    model, tok = tiny
    engine = HFGenerationEngine(model, tok)
    prompt = ids(tok, PROMPTS[:1])
    (full,) = generate_all(engine, prompt, SamplingParams(temperature=0.0, max_tokens=12, skip_special_tokens=False))
    text = full.outputs[0].text
    stop = text[len(text) // 3: len(text) // 3 + 3]
    assert stop.strip(), text
    keep = SamplingParams(temperature=0.0, max_tokens=12, stop=[stop], include_stop_str_in_output=True,
                          skip_special_tokens=False)
    drop = SamplingParams(temperature=0.0, max_tokens=12, stop=stop, skip_special_tokens=False)
    (k,) = generate_all(engine, prompt, keep)
    (d,) = generate_all(engine, prompt, drop)
    cut = text.index(stop)
    assert k.outputs[0].finish_reason == "stop" and k.outputs[0].text == text[: cut + len(stop)]
    assert d.outputs[0].text == text[:cut]
    got = k.outputs[0].token_ids
    assert got == full.outputs[0].token_ids[: len(got)] and len(got) < 12


def test_concurrent_calls_are_batched(tiny):
    model, tok = tiny
    engine = HFGenerationEngine(model, tok, max_batch=4)
    outs = generate_all(engine, ids(tok, PROMPTS * 4), SamplingParams(temperature=1.0, max_tokens=4))
    assert len(outs) == 12 and all(len(o.outputs[0].token_ids) == 4 for o in outs)
    assert engine.batches_run == 3


def test_logprobs_match_a_full_forward(tiny):
    model, tok = tiny
    engine = HFGenerationEngine(model, tok)
    p = ids(tok, PROMPTS[1:2])[0]
    (out,) = generate_all(engine, [p], SamplingParams(temperature=0.7, max_tokens=6, logprobs=1))
    gen = out.outputs[0].token_ids
    with torch.inference_mode():
        logits = model(torch.tensor([p + gen])).logits[0, len(p) - 1:-1].float() / 0.7
    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(gen).unsqueeze(1)).squeeze(1)
    got = torch.tensor([lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, gen)])
    assert torch.allclose(got, ref, atol=1e-4)


def test_seeded_sampling_top_k_and_stop_token_ids(tiny):
    model, tok = tiny
    p = ids(tok, PROMPTS)
    sp = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8)
    a = generate_all(HFGenerationEngine(model, tok, seed=3), p, sp)
    b = generate_all(HFGenerationEngine(model, tok, seed=3), p, sp)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    greedy = generate_all(HFGenerationEngine(model, tok), p, SamplingParams(temperature=0.0, max_tokens=5))
    top1 = generate_all(HFGenerationEngine(model, tok), p, SamplingParams(temperature=1.0, top_k=1, max_tokens=5))
    assert [o.outputs[0].token_ids for o in greedy] == [o.outputs[0].token_ids for o in top1]
    first = greedy[0].outputs[0].token_ids[0]
    (stopped,) = generate_all(HFGenerationEngine(model, tok), p[:1],
                              SamplingParams(temperature=0.0, max_tokens=5, stop_token_ids=[first]))
    assert stopped.outputs[0].token_ids == [first] and stopped.outputs[0].finish_reason == "stop"
    (late,) = generate_all(HFGenerationEngine(model, tok), p[:1],
                           SamplingParams(temperature=0.0, max_tokens=5, min_tokens=3, stop_token_ids=[first]))
    assert len(late.outputs[0].token_ids) >= 3


def test_bad_requests_are_clear_errors(tiny):
    model, tok = tiny
    engine = HFGenerationEngine(model, tok)
    with pytest.raises(ValueError, match="empty"):
        generate_all(engine, [[]], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    (zero,) = generate_all(engine, [[1, 2]], SamplingParams(max_tokens=0))
    assert zero.outputs[0].token_ids == [] and zero.outputs[0].finish_reason == "length"
