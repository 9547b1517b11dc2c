"""What a weight sync delivered to a vLLM engine, checked the same way on every processor.

Greedy text is no fixed point: a bf16 model's argmax can flip on a near-tie when the kernels
change, and vLLM's CPU build picks its GEMM kernels by processor (oneDNN on AVX2/AVX-512, the
SGL AMX kernels for small weights and AMX tiles on Xeons with AMX), and by batch shape. So a sync is
checked on two things that say what is meant:

- **the tensors**, exactly: every tensor the engine's model still holds in readable form
  (:func:`openrlhf_sgrpo.engine.weight_sync.read_worker_weights`: embedding, norms, biases, the LM
  head) equals the trainer's as that load leaves it (:func:`as_loaded`: a first load and a sync
  round differently where a parameter is held in another dtype than the model's). vLLM's CPU
  build repacks Linear weights (their parameters read back empty), so those are covered by
- **the function**: teacher-forced log-probs of a fixed sequence (``prompt_logprobs``, one
  prefill, prefix cache reset first) against the trainer's own fp32 forward of the same weights,
  within a tolerance stated here, and far from the other weights' log-probs.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import torch

# Mean |engine - trainer| of teacher-forced log-probs (nats/token) that counts as "the same
# function". Measured on the fitted tiny policy (2 layers, hidden 64, 151,936-token vocabulary) on
# an AVX-512 EPYC: fp32 engine vs fp32 trainer ~1e-6; bf16 engine vs fp32 trainer 0.03, 0.08 after
# the scramble below (its logits are 3x larger); bf16 keeps 8 bits of mantissa, ~0.4% per weight
# and activation, whichever kernel computes it. A head left with its old weights was 16 nats off.
SAME_FUNCTION_NATS = {torch.float32: 1e-3, torch.bfloat16: 0.25}
# The weight change a probe makes must move the trainer's own log-probs by this many tolerances,
# so a weight that did not arrive cannot hide inside the tolerance (the scramble: ~4.7 nats/token).
CHANGE_FACTOR = 10

def policy_log_probs(model, sequence: list[int], temperature: float) -> torch.Tensor:
    """log p(token i+1 | tokens <= i) of the tempered policy, fp32, on the CPU: column i matches
    action-mask column i. Runs where the model is (scripts/gpu_sync_check.py runs it on CUDA)."""
    with torch.no_grad():
        seq = torch.tensor([sequence], device=next(model.parameters()).device)
        logits = model(seq).logits[0, :-1].float() / temperature
        return torch.log_softmax(logits, -1).gather(1, seq[0, 1:, None])[:, 0].cpu()


def scramble_(model) -> None:
    """A known, large weight change in place: every weight of the last MLP flips sign and the
    embedding scales by 3 (and an untied LM head with it), so the policy's output and log-probs
    move far from the fitted ones."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layers.1.mlp" in name:
                p.neg_()
            if name.endswith(("embed_tokens.weight", "lm_head.weight")):  # a tied head is listed once
                p.mul_(3.0)


FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def expected_engine_tensors(model) -> dict[str, torch.Tensor]:
    """The trainer's parameters under vLLM's names: q/k/v and gate/up concatenated as vLLM fuses
    them (rows, in that order), the LM head as the embedding when the model ties them."""
    hf = {name: p.detach().float().cpu().clone() for name, p in model.named_parameters()}
    out = dict(hf)
    for name, tensor in hf.items():
        for fused, parts in FUSED.items():
            if f".{parts[0]}." in name:
                out[name.replace(parts[0], fused)] = torch.cat([hf[name.replace(parts[0], p)] for p in parts])
    if "lm_head.weight" not in out:  # tied: HF names only the embedding
        out["lm_head.weight"] = hf["model.embed_tokens.weight"]
    return out


LOADS = ("checkpoint", "sync")


def as_loaded(tensor: torch.Tensor, dtype: torch.dtype, held: torch.dtype, loaded_by: str) -> torch.Tensor:
    """The trainer's ``tensor`` as vLLM holds it in a parameter of dtype ``held`` in an engine of
    model dtype ``dtype``. The first load (``"checkpoint"``) rounds to the model dtype before any
    kernel set-up; a sync (``"sync"``, a reload) copies the trainer's values into the parameter as
    it is. They differ where a parameter is held in another dtype than the model's: the biases of
    the SGL-kernel Linears of vLLM's CPU build on an AMX Xeon, fp32 in a bf16 engine."""
    if loaded_by not in LOADS:
        raise ValueError(f"loaded_by must be one of {LOADS}, got {loaded_by!r}")
    return tensor.to(dtype).to(held) if loaded_by == "checkpoint" else tensor.to(held)


def held_bias_dtype(model_dtype: torch.dtype) -> torch.dtype:
    """The dtype a vLLM CPU engine holds a small Linear's bias in: fp32 in a bf16 engine on the SGL
    kernels' path (an AMX Xeon, or ``SGRPO_TEST_VLLM_GEMM=amx``), else the model's. A test asserts it
    to show which path it ran."""
    from openrlhf_sgrpo.testing import vllm_gemm_choice

    amx_path = vllm_gemm_choice() == "amx" or torch.cpu._is_amx_tile_supported()
    return torch.float32 if amx_path and model_dtype == torch.bfloat16 else model_dtype


def differing_tensors(engine: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                      dtype: torch.dtype, loaded_by: str) -> list[str]:
    """Names whose engine tensor is not the trainer's as that load leaves it (:func:`as_loaded`);
    a name the trainer lacks counts as differing."""
    bad = []
    for name, tensor in engine.items():
        want = expected.get(name)
        if (want is None or want.shape != tensor.shape
                or not torch.equal(as_loaded(want, dtype, tensor.dtype, loaded_by), tensor)):
            bad.append(name)
    return sorted(bad)


def log_probs_of(output, sequence: list[int]) -> torch.Tensor:
    """log p(sequence[i] | sequence[:i]) for i >= 1 from a vLLM RequestOutput's prompt_logprobs."""
    rows = output.prompt_logprobs[1:]
    return torch.tensor([row[token].logprob for row, token in zip(rows, sequence[1:])], dtype=torch.float64)


async def engine_state(llm, sequence: list[int]) -> dict:
    """On the engine's loop: the teacher-forced log-probs of ``sequence`` (one prefill of it alone,
    the prefix cache emptied first so no cached KV of other weights or batches enters) and every
    readable tensor of each worker (the first worker's; all must agree)."""
    import vllm
    from vllm.inputs import TokensPrompt

    from openrlhf_sgrpo.engine.weight_sync import read_worker_weights

    await llm.reset_prefix_cache()
    params = vllm.SamplingParams(temperature=1.0, max_tokens=1, prompt_logprobs=0)
    final = None
    async for out in llm.generate(TokensPrompt(prompt_token_ids=list(sequence)), params,
                                  request_id=f"probe-{uuid.uuid4().hex}"):
        final = out
    workers = await llm.collective_rpc(read_worker_weights)
    return {"log_probs": log_probs_of(final, sequence), "tensors": workers[0]}


def state_of_local_engine(engine, sequence: list[int]) -> dict:
    """:func:`engine_state` of our single-machine ``VLLMGenerationEngine`` (its private loop)."""
    return engine._call(engine_state(engine.llm, sequence))


def state_in_rollout_actor(rollout_actor, sequence: list[int]) -> dict:
    """Inside OpenRLHF's ``RolloutRayActor`` (``__ray_call__``): :func:`engine_state` on the loop
    the engine runs on."""
    from openrlhf_sgrpo.openrlhf_ext.cpu_weight_sync import _engine_loop

    return asyncio.run_coroutine_threadsafe(engine_state(rollout_actor.llm, sequence),
                                            _engine_loop(rollout_actor)).result(300)


def sync_round_trip(model, sequence: list[int], state: Callable[[], dict], sync: Callable[[], object],
                    change: Callable[[torch.nn.Module], None]) -> tuple[dict, dict, dict]:
    """Before, after ``change(model)`` and a ``sync()``, and after the old weights went back and
    another ``sync()``: the engine's ``state()``, the trainer's fp32 log-probs of ``sequence`` and
    its tensors under vLLM's names, each keyed ``before`` / ``changed`` / ``restored``."""
    states, references, expected = {}, {}, {}

    def record(key: str) -> None:
        states[key] = state()
        references[key] = policy_log_probs(model, sequence, temperature=1.0)
        expected[key] = expected_engine_tensors(model)

    record("before")
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    try:
        change(model)
        sync()
        record("changed")
    finally:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(saved[name])
        sync()
    record("restored")
    return states, references, expected


def mean_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().mean())


def check_sync_round_trip(states: dict, references: dict, expected: dict, dtype: torch.dtype,
                          *, before: str, relative_tol: float = 0.0) -> dict:
    """The three engine states of a sync test (``before``, ``changed`` after a known weight change
    and a sync, ``restored`` after the weights went back and another sync) against the trainer's
    tensors (``expected``, from :func:`expected_engine_tensors`: the LM head is the embedding where
    the trainer ties them, its own matrix where not) and fp32 log-probs in the same states.

    ``relative_tol`` widens each state's log-prob bound to that fraction of how far the change moved
    the trainer, where it is larger than the dtype's: a bf16 engine of a real-size model rounds its
    way further from the fp32 trainer than the toy's (SmolLM2 perturbed: 0.33 nats/token with every
    weight delivered, 7.7 moved, scripts/gpu_sync_check.py), while a sync that did not arrive stays
    off by the whole move. The round trip (restored vs before, same engine) keeps the dtype's bound.
    ``before``: how the engine got its weights before the round trip (:func:`as_loaded`).
    Returns the gaps, for the test's log."""
    tol = SAME_FUNCTION_NATS[dtype]
    gaps = {"trainer_moved": mean_gap(references["changed"], references["before"])}
    assert gaps["trainer_moved"] >= CHANGE_FACTOR * tol, gaps  # the probe's change is large enough
    for key in ("before", "changed", "restored"):
        bad = differing_tensors(states[key]["tensors"], expected[key], dtype, before if key == "before" else "sync")
        assert bad == [], (key, bad[:20])
        gaps[key] = mean_gap(states[key]["log_probs"], references[key])
    # the engine computes the trainer's function in each state: so the change arrived and went back
    state_tol = max(tol, relative_tol * gaps["trainer_moved"])
    assert max(gaps[key] for key in ("before", "changed", "restored")) <= state_tol, (state_tol, gaps)
    gaps["round_trip"] = mean_gap(states["restored"]["log_probs"], states["before"]["log_probs"])
    assert gaps["round_trip"] <= tol, gaps
    return gaps
