"""OpenRLHF's real executor driven by the real tiny Qwen2 through HFGenerationEngine, then the
real `SamplesGenerator._process_response_into_experience` and replay-buffer batching.

OpenRLHF's samples_generator imports `vllm` at module level. Where vLLM is installed the real one
is used; elsewhere only that import is stubbed, the way OpenRLHF's own tests do, and every module
imported under the stub is dropped afterwards: a later test (the cluster tests) must import
OpenRLHF's vllm_engine against the real vLLM, not a module bound to the stub.
"""

import asyncio
import sys
import types

import pytest
import torch
from agent_fakes import MiniToolServer

from agent_env import info_keys as K
from agent_env import metadata as M
from agent_env.config import config_from_dict
from agent_env.openrlhf_agent import AgentExecutor
from agent_env.tools import get_toolset
from openrlhf_sgrpo import assets
from openrlhf_sgrpo.engine import vllm_unavailable_reason
from openrlhf_sgrpo.engine.hf import HFGenerationEngine
from openrlhf_sgrpo.engine.sampling import SamplingParams


@pytest.fixture(scope="module")
def tiny():
    return assets.tiny_qwen2(seed=2)


@pytest.fixture()
def samples_generator(monkeypatch):
    if vllm_unavailable_reason() is None:
        from openrlhf.trainer.ppo_utils import samples_generator

        yield samples_generator
        return
    imported_before = set(sys.modules)
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = SamplingParams
    inputs, utils = types.ModuleType("vllm.inputs"), types.ModuleType("vllm.utils")
    inputs.TokensPrompt, utils.random_uuid = dict, lambda: "uuid"
    vllm.inputs, vllm.utils = inputs, utils
    for name, mod in (("vllm", vllm), ("vllm.inputs", inputs), ("vllm.utils", utils)):
        monkeypatch.setitem(sys.modules, name, mod)
    from openrlhf.trainer.ppo_utils import samples_generator

    yield samples_generator
    for name in set(sys.modules) - imported_before:  # bound to the stub: never reuse them
        del sys.modules[name]


@pytest.mark.slow
def test_executor_with_real_model_to_experience(tiny, samples_generator):
    from openrlhf.trainer.ppo_utils.experience import Experience, make_experience_batch

    model, tok = tiny
    engine = HFGenerationEngine(model, tok, max_batch=8)
    max_len = 160
    with MiniToolServer([{"id": "3", "contents": '"Paris"\nParis is in France.'}]) as srv:
        cfg = config_from_dict({"retriever_url": srv.url("/retrieve"), "template": "none", "max_turns": 3})

        # The random policy's greedy first token ends every turn (a caller-supplied stop token id),
        # so trajectories run several turns with real observations in between; sampled ones run
        # until the token budget.
        first = asyncio.run(engine.generate(tok("Q: x?")["input_ids"], SamplingParams(temperature=0.0, max_tokens=1)))
        stop_id = first.outputs[0].token_ids[0]
        params = [SamplingParams(temperature=0.0, max_tokens=None, logprobs=1, stop_token_ids=[stop_id])] * 3 + \
                 [SamplingParams(temperature=1.0, max_tokens=None, logprobs=1)] * 3

        async def main():
            ex = AgentExecutor(cfg)
            try:
                return await asyncio.gather(*[ex.execute("Q: x?", '["Paris"]', sp, max_len, tok, engine)
                                              for sp in params])
            finally:
                await get_toolset(cfg).close()

        responses = asyncio.run(main())

    gen = object.__new__(samples_generator.SamplesGenerator)
    exps = [gen._process_response_into_experience(r, max_len=max_len) for r in responses]
    ranges = [r["action_ranges"] for r in responses]
    assert all(len(rs) >= 2 for rs in ranges[:3]), ranges  # multi-turn, observations in between
    for r, e in zip(responses, exps):
        seq_len = e.sequences.shape[1]
        mask = e.action_mask[0]
        expected = torch.zeros(seq_len - 1, dtype=mask.dtype)
        for s, t in r["action_ranges"]:
            expected[s - 1:min(t, seq_len) - 1] = 1  # action-mask column i-1 <-> token i
        assert torch.equal(mask, expected)
        # observation tokens (between ranges) are outside the mask
        for (_, end), (nxt, _) in zip(r["action_ranges"], r["action_ranges"][1:]):
            assert nxt > end and not mask[end - 1:nxt - 1].any()
        assert set(K.metadata_keys(cfg.max_turns, cfg.topk)) <= set(e.info)
        assert e.info[K.TURNS].item() == len(r["action_ranges"])
        assert e.info[K.ACTION_TOKENS].item() == int(mask.sum())
        assert e.info[K.ACTION_TOKENS].item() <= e.response_length.item()  # OpenRLHF #1243: spans tools
        assert e.rollout_log_probs is not None and e.rollout_log_probs.shape == e.action_mask.shape
    assert all(e.info[K.INVALID_ACTIONS].item() >= 1 for e in exps[:3])  # gibberish is not an action
    assert any(e.info[K.ACTION_TOKENS].item() < e.response_length.item() for e in exps)
    turns = M.decode_turns({k: v[0] for k, v in exps[0].info.items()})
    assert [(t.start, t.end) for t in turns] == [tuple(x) for x in responses[0]["action_ranges"]]

    # OpenRLHF merges per-sample infos key by key; ragged key sets or lists would fail here
    merged = Experience.concat_experiences(exps, tok.pad_token_id)
    expected_turns = [len(r["action_ranges"]) for r in responses]
    assert merged.info[K.TURNS].flatten().tolist() == expected_turns
    batch = make_experience_batch(exps)
    assert torch.cat(batch.info[K.TURNS]).tolist() == expected_turns
