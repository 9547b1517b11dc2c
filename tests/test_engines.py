"""The single-machine engines side by side: vLLM (its CPU build here) and the HF fallback.

The policy is the fitted tiny Qwen2 of ``tests/fitted_policy.py`` (one decisive first action per
question), so what the tests compare holds by construction. The vLLM engine is built as the
runner, the demo and the eval CLI build it (:func:`openrlhf_sgrpo.engine.build_engine`), in
fp32 like the training model, so greedy tokens can be compared with the HF engine's.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import torch
from cluster_world import scramble_
from engine_probe import check_sync_round_trip, held_bias_dtype, state_of_local_engine, sync_round_trip
from fitted_policy import CODE_OUTPUT, QUESTIONS, TEMPLATE, fitted_policy_dir
from shm_check import left_behind, live_names, process_state, shm_files, socket_files
from sites import GEMM_SITE
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent_env import info_keys as K
from agent_env.actions import STOP_STRINGS
from agent_env.config import AgentConfig
from agent_env.templates import build_prompt
from openrlhf_sgrpo.engine import build_engine, vllm_unavailable_reason
from openrlhf_sgrpo.engine.sampling import SamplingParams
from openrlhf_sgrpo.engine.weight_sync import leftover_files
from openrlhf_sgrpo.testing import GEMM_ENV, pythonpath_led_by

_NO_VLLM = vllm_unavailable_reason()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(_NO_VLLM is not None, reason=f"vLLM engine tests: {_NO_VLLM}")]
CORPUS = [
    {"id": "1", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "2", "contents": '"Nile"\nThe Nile flows north through Cairo into the Mediterranean.'},
    {"id": "3", "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare.'},
]
MAX_LEN = 512
# fp32 logits of the same weights through vLLM's and torch's kernels differ by ~1e-5; a greedy
# token is the trainer's argmax up to this much (a near-tie may resolve either way)
ARGMAX_SLACK = 1e-3
HEAD_GAIN = 20.0  # the untied random model's head scale: the scramble then moves ~25 nats/token


@pytest.fixture(scope="module")
def policy():
    folder = fitted_policy_dir()
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), \
        AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def shm_before() -> set[str]:
    return shm_files()


@pytest.fixture(scope="module")
def vllm_engine(policy, shm_before):
    folder, model, tok = policy
    engine = build_engine("vllm", model, tok, model_path=folder, max_batch=16, max_model_len=MAX_LEN,
                          dtype="float32", enforce_eager=True)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    from openrlhf_sgrpo.local.services import cached_index_for, local_services

    corpus = tmp_path_factory.mktemp("engines") / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in CORPUS))
    with local_services(cached_index_for(corpus, progress=False), topk=2) as urls:
        yield urls


def _prompt_ids(tok, question: str) -> list[int]:
    return tok(build_prompt(TEMPLATE, question, tok), add_special_tokens=False).input_ids


def _generate(engine, prompts: list[list[int]], params: SamplingParams) -> list:
    async def all_at_once():
        return await asyncio.gather(*[engine.generate(p, params) for p in prompts])
    return asyncio.run(all_at_once())


def test_stop_strings_end_the_turn_and_the_budget_cuts_it(vllm_engine, policy):
    _, _, tok = policy
    prompts = [_prompt_ids(tok, q) for q, _ in QUESTIONS]
    stop = SamplingParams(temperature=0.0, max_tokens=24, stop=list(STOP_STRINGS), include_stop_str_in_output=True)
    search, code, answer = _generate(vllm_engine, prompts, stop)
    assert search.outputs[0].text == "<search> france </search>" and search.outputs[0].finish_reason == "stop"
    assert code.outputs[0].text.endswith("</code>") and code.outputs[0].finish_reason == "stop"
    assert answer.outputs[0].text.startswith("<answer>") and answer.outputs[0].text.endswith("</answer>")
    # the text is the decoded tokens, closer included (the agent keeps it in the trajectory)
    assert tok.decode(search.outputs[0].token_ids) == search.outputs[0].text
    (cut,) = _generate(vllm_engine, prompts[:1], SamplingParams(temperature=0.0, max_tokens=3, stop=list(STOP_STRINGS),
                                                                include_stop_str_in_output=True))
    assert len(cut.outputs[0].token_ids) == 3 and cut.outputs[0].finish_reason == "length"


def _argmax_shortfall(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """Per generated token: how far its logit falls below the best logit of the trainer's own fp32
    forward of ``prompt + generated`` (0 where it is the argmax)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + list(generated)])).logits[0, len(prompt) - 1: -1].float()
    picked = logits.gather(1, torch.tensor(list(generated))[:, None])[:, 0]
    return logits.max(-1).values - picked


def test_greedy_tokens_are_the_trainer_models_argmax(vllm_engine, policy):
    """fp32 engine, fp32 trainer: every greedy token vLLM picks is the argmax of the trainer's own
    forward, up to float noise (ARGMAX_SLACK). A near-tie (the fitted policy answers gold or wrong
    half and half) may go either way on another processor's kernels, so the tokens are not
    compared with the HF engine's; how many agree is printed."""
    _, model, tok = policy
    prompts = [_prompt_ids(tok, q) for q, _ in QUESTIONS]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    ours = _generate(vllm_engine, prompts, params)
    theirs = _generate(build_engine("hf", model, tok, max_batch=4), prompts, params)
    agree = []
    for prompt, a, b in zip(prompts, ours, theirs):
        x, y = a.outputs[0].token_ids, b.outputs[0].token_ids
        assert len(x) == 32
        shortfall = _argmax_shortfall(model, prompt, x)
        assert float(shortfall.max()) <= ARGMAX_SLACK, (shortfall.tolist(), tok.decode(x))
        agree.append(next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), len(x)))
    print(f"greedy tokens identical to the HF engine's before the first difference: {agree} of 32")


def _agent_rollout(engine, tok, urls, **kwargs):
    """The runner's rollout (OpenRLHF's executor, our agent) against the module's real tools."""
    from openrlhf_sgrpo.local.rollout import AgentRollout

    cfg = AgentConfig(retriever_url=urls.retriever_url, sandbox_url=urls.sandbox_url, template=TEMPLATE,
                      max_turns=2, topk=2, max_obs_tokens=48)
    return AgentRollout(engine, tok, cfg, MAX_LEN, **kwargs)


def _rollout(engine, tok, urls) -> list:
    rollout = _agent_rollout(engine, tok, urls, max_tokens_per_turn=16)
    try:
        return rollout.run([q for q, _ in QUESTIONS], [[g] for _, g in QUESTIONS], n=1, greedy=True,
                           progress=False).samples
    finally:
        rollout.close()


def test_agent_trajectories_have_the_same_structure_on_both_engines(vllm_engine, policy, services):
    """OpenRLHF's executor with our agent and the real tools, greedy, once per engine: the first turn
    has the same kind and tool call on both, the decisive fitted actions (search, code) the same
    tokens; every first turn is the trainer's argmax on both engines (the answer's name is a
    fitted coin flip, so its tokens may differ between kernels and are not compared)."""
    _, model, tok = policy
    ours, theirs = _rollout(vllm_engine, tok, services), _rollout(build_engine("hf", model, tok), tok, services)
    assert [s.info[K.turn_kind_key(0)] for s in ours] == [K.KIND_SEARCH, K.KIND_CODE, K.KIND_ANSWER]
    assert [s.info[K.turn_kind_key(0)] for s in theirs] == [K.KIND_SEARCH, K.KIND_CODE, K.KIND_ANSWER]
    for samples in (ours, theirs):
        for s in samples:
            start, end = int(s.info[K.turn_start_key(0)]), int(s.info[K.turn_end_key(0)])
            seq = s.sequences.tolist()
            assert float(_argmax_shortfall(model, seq[:start], seq[start:end]).max()) <= ARGMAX_SLACK
            assert all(s.action_mask[start - 1:end - 1].tolist())  # the turn is the policy's
    for a, b in list(zip(ours, theirs))[:2]:  # search and code: the same action, token for token
        end = int(a.info[K.turn_end_key(0)])
        assert end == int(b.info[K.turn_end_key(0)])
        assert a.sequences[:end].tolist() == b.sequences[:end].tolist()
        assert a.action_mask[: end - 1].tolist() == b.action_mask[: end - 1].tolist()
    search, code, _ = ours
    assert search.info[K.SEARCH_CALLS] >= 1 and code.info[K.CODE_CALLS] >= 1
    assert f"<result>{CODE_OUTPUT}" in tok.decode(code.sequences)  # the sandbox ran print(6 * 7)
    same = [a.sequences.tolist() == b.sequences.tolist() for a, b in zip(ours, theirs)]
    print(f"whole trajectories identical on both engines: {sum(same)} of {len(same)}")


def _sampled_rollout(engine, tok, urls, seed: int | None, load: int = 0) -> list[list[int]]:
    """Sampled (temperature 1) trajectories, 4 per question, through OpenRLHF's executor, our agent
    and the real tools; ``load`` unseeded requests of other text share the engine meanwhile (they
    change the batches and take draws from the engine-wide generator)."""
    import threading

    rollout = _agent_rollout(engine, tok, urls, max_tokens_per_turn=24, temperature=1.0)
    other = _prompt_ids(tok, "Which river flows through Cairo?")
    noise = threading.Thread(target=_generate, args=(engine, [other] * load, SamplingParams(max_tokens=64)))
    noise.start()
    try:
        samples = rollout.run([q for q, _ in QUESTIONS], [[g] for _, g in QUESTIONS], n=4, progress=False,
                              seed=seed).samples
    finally:
        noise.join()
        rollout.close()
    return [s.sequences.tolist() for s in samples]


def test_a_seeded_sampled_rollout_draws_the_same_tokens_whatever_the_batching(vllm_engine, policy, services):
    """The runner seeds each step's rollout (``AgentRollout.run(seed=...)``): every engine call of
    trajectory j samples with a seed derived from (seed, j, call), which vLLM turns into a generator
    of the request's own. So a rerun draws the same tokens, even with other requests in the engine.
    Unseeded, draws come from one engine-wide generator in batch order: the control differs.
    (Tokens, not logits, are compared: both runs compute the same fp32 logits on one machine, up to
    batch-shape float sums, which could move a near-tie; one trajectory of 12 may differ.)"""
    _, _, tok = policy
    first = _sampled_rollout(vllm_engine, tok, services, seed=11)
    again = _sampled_rollout(vllm_engine, tok, services, seed=11, load=8)
    unseeded = _sampled_rollout(vllm_engine, tok, services, seed=None, load=8)
    same = sum(a == b for a, b in zip(first, again))
    control = sum(a == b for a, b in zip(first, unseeded))
    print(f"identical trajectories of 12: seeded rerun {same}, unseeded {control}")
    assert same >= 11 and control < same, (same, control)


def test_many_seeded_long_prompts_at_once_leave_the_cpu_engine_alive(vllm_engine):
    """A study step's rollout: 32 trajectories in flight, each a seeded request (its own generator),
    prompts of a few hundred tokens. With vLLM's default 2,048-token step budget their prefills
    are split across steps, and vLLM 0.29 then rewinds each split request's generator offset,
    which a CPU generator lacks: every request failed ("CPU Generator does not use offset") and
    the engine died. The engine now schedules whole prefills only on a CPU."""
    import random

    config = vllm_engine.llm.vllm_config.scheduler_config
    assert config.enable_chunked_prefill is False and config.max_num_batched_tokens >= MAX_LEN
    rng = random.Random(5)
    prompts = [[rng.randrange(100, 5000) for _ in range(rng.randrange(250, MAX_LEN - 16))] for _ in range(32)]

    async def all_at_once():
        return await asyncio.gather(*[vllm_engine.generate(p, SamplingParams(max_tokens=4, temperature=1.0,
                                                                             seed=100 + i))
                                      for i, p in enumerate(prompts)])
    outs = asyncio.run(all_at_once())
    assert all(len(o.outputs[0].token_ids) >= 1 for o in outs)


def _sync_round_trip(engine, model, sequence: list[int]) -> tuple[dict, dict, dict]:
    """``engine_probe.sync_round_trip`` through ``engine.sync_weights``, which loads every tensor."""
    count = len(dict(model.named_parameters()))

    def sync() -> None:
        assert engine.sync_weights(model) == count

    return sync_round_trip(model, sequence, lambda: state_of_local_engine(engine, sequence), sync, scramble_)


def _probe_sequence(tok) -> list[int]:
    """A prompt and the fitted search action after it: the log-probs of a realistic trajectory."""
    return _prompt_ids(tok, QUESTIONS[0][0]) + tok("<search> france </search>", add_special_tokens=False).input_ids


def test_sync_weights_reach_the_engine_and_come_back(vllm_engine, policy):
    """A known change reaches every readable tensor exactly and the engine's log-probs become the
    changed trainer's (tied LM head included: vLLM's CPU build re-packs it only through
    ``repack_tied_head``); syncing the old weights back restores both. Checked by value and
    tolerance (``engine_probe``), not by greedy text, so it holds on every processor."""
    _, model, tok = policy
    assert model.config.tie_word_embeddings
    gaps = check_sync_round_trip(*_sync_round_trip(vllm_engine, model, _probe_sequence(tok)), dtype=torch.float32,
                                 before="sync")  # build_engine syncs the model it is given
    print(f"mean |engine - trainer| log-prob gaps (nats/token): {gaps}")
    assert leftover_files() == []


def test_a_sync_that_misses_a_tensor_raises(vllm_engine, policy, monkeypatch):
    """vLLM only logs the weights a reload did not get and keeps their old values; the engine
    counts what each worker read and refuses a short sync (the GPU bug of 2026-11-27 dropped a
    random 10-20 % of the tensors from every sync and trained on unnoticed). A full sync after it
    is accepted again."""
    import openrlhf_sgrpo.engine.weight_sync as weight_sync

    _, model, _ = policy
    full = weight_sync.write_weights

    def one_short(named, *args, **kwargs):
        return full(list(named)[:-1], *args, **kwargs)

    monkeypatch.setattr(weight_sync, "write_weights", one_short)
    n = sum(1 for _ in model.named_parameters())
    with pytest.raises(RuntimeError, match=f"delivered {n - 1} of the model's {n} tensors"):
        vllm_engine.sync_weights(model)
    monkeypatch.setattr(weight_sync, "write_weights", full)
    assert vllm_engine.sync_weights(model) == n
    assert leftover_files() == []


def _gemm_as_on_amx(monkeypatch) -> None:
    """vLLM's CPU GEMM dispatch as on a Xeon with AMX, in the engine process this test starts next
    (``openrlhf_sgrpo.testing.dispatch_gemm_as_on_amx``, installed there by ``tests/gemm_site``'s
    sitecustomize), or a skip that says why it is not needed or cannot run here."""
    if torch.cpu._is_amx_tile_supported():
        pytest.skip("this processor has AMX: the 'processor' case already runs vLLM's AMX dispatch")
    if not torch.cpu._is_avx512_bf16_supported():
        pytest.skip("vLLM's SGL GEMM kernels (an AMX Xeon's path) need AVX-512 BF16, which this processor lacks")
    monkeypatch.setenv(GEMM_ENV, "amx")
    monkeypatch.setenv("PYTHONPATH", pythonpath_led_by(GEMM_SITE, os.environ.get("PYTHONPATH")))


def test_the_amx_gemm_switch_changes_only_vllms_answer_to_amx(monkeypatch):
    """``SGRPO_TEST_VLLM_GEMM=amx`` turns vLLM's own per-Linear rule to what it answers on an AMX Xeon
    (small bf16 weights to the SGL kernels; fp32 and large weights still not), restores torch's
    AMX probe after each call, is idempotent, and a bad value is named."""
    from types import SimpleNamespace

    import vllm.model_executor.layers.utils as dispatch

    from openrlhf_sgrpo.testing import dispatch_gemm_as_on_amx, vllm_gemm_choice

    probe = torch.cpu._is_amx_tile_supported
    # vLLM's own rule (already switched in this process when the whole run is under the variable)
    vllms = getattr(dispatch.check_cpu_sgl_kernel, "__wrapped_rule__", dispatch.check_cpu_sgl_kernel)
    module = SimpleNamespace(check_cpu_sgl_kernel=vllms)
    dispatch_gemm_as_on_amx(module)
    dispatch_gemm_as_on_amx(module)
    rule = module.check_cpu_sgl_kernel
    assert rule.__wrapped_rule__ is vllms
    assert rule(128, 64, torch.bfloat16) and rule(64, 64, torch.bfloat16)
    assert not rule(128, 64, torch.float32) and not rule(4096, 4096, torch.bfloat16)  # 32 MiB: oneDNN on AMX too
    assert vllms(128, 64, torch.bfloat16) == probe()  # the rule itself is unchanged
    assert torch.cpu._is_amx_tile_supported is probe
    monkeypatch.setenv(GEMM_ENV, "sgl")
    with pytest.raises(ValueError, match="SGRPO_TEST_VLLM_GEMM must be one of .*'sgl'"):
        vllm_gemm_choice()


def _digest_check(engine, model) -> list:
    """``--sgrpo.verify_weight_sync``'s comparison (openrlhf_ext/sync_verify.py) of what the engine's
    worker holds with ``model``: one EngineCheck."""
    from openrlhf_sgrpo.engine.weight_check import worker_weight_digests
    from openrlhf_sgrpo.openrlhf_ext.sync_verify import compare_reports, trainer_digests, wanted_forms

    reports = engine._call(engine.llm.collective_rpc(worker_weight_digests))
    return compare_reports(reports, trainer_digests(model, wanted_forms(reports), None, digest=True))


@pytest.mark.parametrize("gemm", ["processor", "amx"])
def test_sync_reaches_an_untied_head_in_bf16(policy, tmp_path, monkeypatch, gemm):
    """The same round trip for a model whose LM head is a matrix of its own, in bf16 (the dtype
    OpenRLHF's engines serve): the head is reloaded as a weight, not re-packed from the embedding.
    Then ``--sgrpo.verify_weight_sync``'s digest comparison finds every readable tensor equal.

    Twice: with the GEMM kernels vLLM's CPU build picks for this processor, and with those it picks
    on a Xeon with AMX (``gemm="amx"``, forced where the kernels run). There the Linears' biases are
    held in fp32 and a sync copies the trainer's fp32 values in unrounded (the first load rounded
    them to bf16): a digest rule that rounded through bf16 failed every sync there (the biases are
    random here, not the zeros of a fresh init, so such a rule fails this test)."""
    from openrlhf_sgrpo import assets

    if gemm == "amx":
        _gemm_as_on_amx(monkeypatch)
    _, _, tok = policy
    model, _ = assets.tiny_qwen2(seed=1)
    model.config.tie_word_embeddings = False
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(model.config).eval()
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():  # a confident head (random init is near-uniform), so the change shows
        model.lm_head.weight.mul_(HEAD_GAIN)
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.1)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    engine = build_engine("vllm", model, tok, model_path=str(tmp_path), max_batch=2, max_model_len=MAX_LEN,
                          dtype="bfloat16", enforce_eager=True, kv_cache_memory_bytes=64 << 20)
    try:
        states, references, expected = _sync_round_trip(engine, model, _probe_sequence(tok))
        (check,) = _digest_check(engine, model)
    finally:
        engine.close()
    # which path ran: the SGL kernels' set-up keeps the biases in fp32, oneDNN's leaves them bf16
    bias = states["before"]["tensors"]["model.layers.0.self_attn.qkv_proj.bias"]
    assert bias.dtype == held_bias_dtype(torch.bfloat16), (gemm, bias.dtype)
    gaps = check_sync_round_trip(states, references, expected, dtype=torch.bfloat16, before="sync")
    print(f"untied bf16 ({gemm} GEMM) mean |engine - trainer| log-prob gaps (nats/token): {gaps}; "
          f"digest check: {check}")
    readable = states["restored"]["tensors"]  # the same weights as the check saw (biases, norms, embedding)
    assert check.differing == [] and check.equal == len(readable) and bias.numel() > 0, (check, sorted(readable))


def test_the_cpu_worker_runs_inside_the_engine_core_process(vllm_engine):
    """One engine process on a CPU, not vLLM's default two (a second Python with torch, ~1 GB),
    and the switch that does it is not left in this process's environment for later engines.

    Asked of this engine's own core process: the test process may also hold other engines' cores,
    ending or ended (a zombie of one force-killed at its close once failed a count over every
    process below the test)."""
    from openrlhf_sgrpo.demo.memory import descendants
    from openrlhf_sgrpo.engine.vllm import core_processes

    if not vllm_engine.on_cpu:
        pytest.skip("the one-process layout is the CPU build's")
    cores = [proc.pid for proc in core_processes(vllm_engine.llm)]
    assert len(cores) == 1 and live_names(cores) == ["VLLM::EngineCor"], cores  # comm: 15 characters
    assert cores[0] in descendants(os.getpid())
    below = live_names(descendants(cores[0]))
    assert not [name for name in below if name.startswith("VLLM::")], below  # vLLM's is "VLLM::Worker"
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0"


def test_close_reaps_a_core_that_outlives_vllms_grace(policy, monkeypatch, tmp_path):
    """vLLM's shutdown SIGKILLs an engine core that has not exited 5 s after its SIGTERM and never
    waits for it. A core that cannot answer (stopped here; a loaded machine in CI) is gone, not a
    zombie of this process, when close() returns. (A killed core leaves its torch.distributed
    ``file://`` store, ``vllm_dist_<uuid>`` in its temp dir: this test points that at ``tmp_path``.)"""
    import signal
    import time

    from openrlhf_sgrpo.engine.vllm import core_processes

    folder, model, tok = policy
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # read by the spawned core, not by this process
    engine = build_engine("vllm", model, tok, model_path=folder, max_batch=2, max_model_len=MAX_LEN,
                          dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 << 20)
    cores = []
    try:
        cores = [proc.pid for proc in core_processes(engine.llm)]
        assert cores, "this vLLM keeps no handle on its engine-core process"
        os.kill(cores[0], signal.SIGSTOP)
        deadline = time.monotonic() + 10  # a signal is delivered when the process next runs
        while process_state(cores[0]).state != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_state(cores[0]).state == "T"
    finally:
        engine.close()
    assert [process_state(pid) for pid in cores] == [None] * len(cores)
    assert [p.name[:len("vllm_dist_")] for p in tmp_path.iterdir()] == ["vllm_dist_"]


def test_the_private_socket_directory_steps_aside_where_it_cannot_serve(monkeypatch, tmp_path):
    """A user's VLLM_RPC_BASE_PATH wins; a temp dir so long that a socket path in it would pass
    the Unix limit falls back to vLLM's own choice, leaving nothing behind; else a fresh dir."""
    from openrlhf_sgrpo.engine import vllm as engine_vllm

    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path))
    assert engine_vllm._private_ipc_dir() is None
    monkeypatch.delenv("VLLM_RPC_BASE_PATH")
    fresh = engine_vllm._private_ipc_dir()
    try:
        assert Path(fresh).is_dir() and not any(Path(fresh).iterdir())
        assert len(fresh) + 1 + engine_vllm.IPC_NAME_LENGTH <= engine_vllm.UNIX_SOCKET_PATH_MAX
    finally:
        os.rmdir(fresh)
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(engine_vllm.tempfile, "tempdir", str(deep))
    assert engine_vllm._private_ipc_dir() is None
    assert list(deep.iterdir()) == []


def test_close_leaves_no_shared_memory_or_socket_files_behind(vllm_engine, shm_before):
    """Last in the module: the engine's processes, their shared-memory queues and the files of
    their ZeroMQ sockets are gone. vLLM binds those sockets to files it never unlinks; they were
    bound in the engine's own directory (so none is left in /tmp), which close() removes."""
    import time

    ipc_dir = vllm_engine.ipc_dir
    assert ipc_dir is not None and not os.environ.get("VLLM_RPC_BASE_PATH")
    sockets = socket_files(ipc_dir)
    assert len(sockets) >= 2, sorted(Path(ipc_dir).iterdir())  # the engine's input and output, at least
    vllm_engine.close()
    assert not Path(ipc_dir).exists()
    deadline = time.monotonic() + 60
    while left_behind(shm_before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left_behind(shm_before) == set()


def test_eval_cli_runs_on_vllm(tmp_path, capsys, policy):
    """``python -m openrlhf_sgrpo.eval --engine vllm`` on three questions: the fitted policy searches,
    runs code and answers against the real retriever and sandbox."""
    from openrlhf_sgrpo.eval.__main__ import main

    folder, _, _ = policy
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in CORPUS))
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"id": str(i), "question": q, "golden_answers": [g]}) + "\n"
                            for i, (q, g) in enumerate(QUESTIONS)))
    out = tmp_path / "eval"
    assert main(["--engine", "vllm", "--model", str(folder), "--corpus", str(corpus), "--data", f"toy={data}",
                 "--template", TEMPLATE, "--max-turns", "2", "--max-len", str(MAX_LEN),
                 "--max-tokens-per-turn", "16", "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"] == "vllm" and summary["qa"]["toy"]["n"] == 3
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 3 and sum(p["search_calls"] for p in preds) >= 1
    assert "| toy " in capsys.readouterr().out
    assert Path(out / "predictions.jsonl").exists()
