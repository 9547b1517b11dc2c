"""The local HF generation engine against the real tiny Qwen2 (random weights, real tokenizer).

Nothing here needs a lucky sample: greedy tokens are checked as argmaxes of a full forward pass
(within float tolerance, so a near-tie cannot flip the verdict), EOS is kept out where a length
is asserted, and the stop-string test steers the model onto a known text with a logit hook.
``SGRPO_TEST_SEED_SHIFT`` shifts the model's and the engine's seeds (openrlhf_sgrpo.testing).
"""

import asyncio

import pytest
import torch

from openrlhf_sgrpo import assets
from openrlhf_sgrpo.engine.hf import HFGenerationEngine
from openrlhf_sgrpo.engine.sampling import SamplingParams
from openrlhf_sgrpo.testing import shifted_seed


@pytest.fixture(scope="module")
def tiny():
    return assets.tiny_qwen2(seed=shifted_seed(1))


PROMPTS = ["Question: what is the capital of France?", "Hi", "<think>one two three four five six</think>"]


def generate_all(engine, prompts, params):
    async def main():
        return await asyncio.gather(*[engine.generate(p, params) for p in prompts])
    return asyncio.run(main())


def ids(tok, texts):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _full_forward_logits(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """Logits predicting each generated token, from one forward pass over prompt + generated."""
    with torch.inference_mode():
        return model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1: -1].float()


def test_greedy_batched_rows_pick_the_argmax_of_a_full_forward(tiny):
    """Left padding, position ids and KV-cache pruning must compute what one unpadded forward
    does: every greedy token is that forward's argmax (up to float noise between the two paths)."""
    model, tok = tiny
    engine = HFGenerationEngine(model, tok, max_batch=8)
    params = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=10)  # EOS kept out: 10 tokens
    outs = generate_all(engine, ids(tok, PROMPTS), params)
    assert engine.batches_run == 1
    for p, out in zip(ids(tok, PROMPTS), outs):
        got = out.outputs[0].token_ids
        assert len(got) == 10 and out.outputs[0].finish_reason == "length"
        logits = _full_forward_logits(model, p, got)
        picked = logits.gather(1, torch.tensor(got).unsqueeze(1)).squeeze(1)
        assert torch.all(picked >= logits.max(-1).values - 1e-4), (got, logits.argmax(-1).tolist())


def test_chunked_prefill_computes_what_one_forward_does(tiny):
    """Prompts prefilled 3 tokens at a time, left-padded in one batch: same argmaxes, same
    log-probs as a full forward of each unpadded row."""
    model, tok = tiny
    engine = HFGenerationEngine(model, tok, max_batch=8, prefill_chunk=3)
    prompts = ids(tok, PROMPTS)
    outs = generate_all(engine, prompts, SamplingParams(temperature=0.0, max_tokens=6, min_tokens=6, logprobs=1))
    assert engine.batches_run == 1 and max(map(len, prompts)) > 3 * 2
    for p, out in zip(prompts, outs):
        got = out.outputs[0].token_ids
        logits = _full_forward_logits(model, p, got)
        picked = logits.gather(1, torch.tensor(got).unsqueeze(1)).squeeze(1)
        assert torch.all(picked >= logits.max(-1).values - 1e-4)
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(got).unsqueeze(1)).squeeze(1)
        assert torch.allclose(torch.tensor([lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, got)]), ref,
                              atol=1e-4)
    with pytest.raises(ValueError, match="prefill_chunk must be >= 1"):
        HFGenerationEngine(model, tok, prefill_chunk=0)


def _steer(model, tok, text: str, after: list[int]):
    """A forward hook that makes greedy decoding write ``text``: +1e4 on the logit of the next
    token of ``text`` after its previous one (or after any token in ``after``, the prompts' last)."""
    script = tok(text, add_special_tokens=False)["input_ids"]
    assert len(set(script)) == len(script), "the steering text needs distinct tokens"
    successor = {t: script[0] for t in after} | dict(zip(script, script[1:]))

    def hook(module, args, kwargs, output):
        for row, last in enumerate(kwargs["input_ids"][:, -1].tolist()):
            if last in successor:
                output.logits[row, -1, successor[last]] += 1e4
        return output

    return model.register_forward_hook(hook, with_kwargs=True)


def test_stop_string_ends_generation_and_is_kept_in_text(tiny):
    model, tok = tiny
    engine = HFGenerationEngine(model, tok)
    prompt = ids(tok, PROMPTS[:1])
    handle = _steer(model, tok, " The capital of France is Paris", after=[prompt[0][-1]])
    try:
        params = dict(temperature=0.0, max_tokens=12, min_tokens=12, skip_special_tokens=False)
        (full,) = generate_all(engine, prompt, SamplingParams(**params))
        text = full.outputs[0].text
        assert text.startswith(" The capital of France is Paris"), text
        stop = " France"
        keep = SamplingParams(**{**params, "min_tokens": 0}, stop=[stop], include_stop_str_in_output=True)
        drop = SamplingParams(**{**params, "min_tokens": 0}, stop=stop)
        (k,) = generate_all(engine, prompt, keep)
        (d,) = generate_all(engine, prompt, drop)
    finally:
        handle.remove()
    cut = text.index(stop)
    assert k.outputs[0].finish_reason == "stop" and k.outputs[0].text == text[: cut + len(stop)]
    assert d.outputs[0].text == text[:cut] == " The capital of"
    got = k.outputs[0].token_ids
    assert got == full.outputs[0].token_ids[: len(got)] and len(got) < 12


def test_concurrent_calls_are_batched(tiny):
    model, tok = tiny
    engine = HFGenerationEngine(model, tok, max_batch=4)
    outs = generate_all(engine, ids(tok, PROMPTS * 4), SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True))
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
    a = generate_all(HFGenerationEngine(model, tok, seed=shifted_seed(3)), p, sp)
    b = generate_all(HFGenerationEngine(model, tok, seed=shifted_seed(3)), p, sp)
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


def test_a_seeded_request_draws_from_its_own_generator(tiny):
    """vLLM's rule, kept by the HF fallback: a request whose params carry a seed samples from a
    generator of its own, so its tokens do not depend on the engine's seed or on the draws of the
    requests batched with it. The same batch (same shapes, so the same logits) under two engine
    seeds: the seeded row is equal token for token, an unseeded row is not; another seed differs."""
    model, tok = tiny
    p = ids(tok, PROMPTS)

    def batch(engine_seed: int, row_seed: int):
        engine = HFGenerationEngine(model, tok, seed=shifted_seed(engine_seed))
        seeded = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=row_seed)
        free = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)

        async def main():
            return await asyncio.gather(engine.generate(p[0], seeded), engine.generate(p[1], free))
        return [o.outputs[0].token_ids for o in asyncio.run(main())]

    (a, free_a), (b, free_b), (c, _) = batch(1, 5), batch(2, 5), batch(1, 6)
    assert a == b and free_a != free_b and a != c
