"""``--sgrpo.verify_weight_sync``: the flag through OpenRLHF's real parser (its refusals naming the
bad value), which syncs it selects, the trainer-side digests against whole-tensor comparison, and
the wrapper's place in the policy actor. The check against a real vLLM engine behind OpenRLHF's
own broadcast runs in ``tests/test_cluster_ray.py::test_trainer_broadcast_reaches_the_vllm_engine_on_cpu``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from openrlhf_sgrpo.cli.train_ppo_ray import CliError, parse_config
from openrlhf_sgrpo.openrlhf_ext.sync_verify import EngineCheck, SyncCheck, sync_is_checked, trainer_digests

BASE = ["--actor.model_name_or_path", "m", "--train.agent_func_path", "agent_env/openrlhf_agent.py",
        "--vllm.num_engines", "1"]


def test_flag_defaults_off_and_takes_n_or_minus_one():
    assert parse_config(BASE).sgrpo.verify_weight_sync == 0
    assert parse_config([*BASE, "--sgrpo.verify_weight_sync", "3"]).sgrpo.verify_weight_sync == 3
    assert parse_config([*BASE, "--sgrpo.verify_weight_sync", "-1"]).sgrpo.verify_weight_sync == -1


@pytest.mark.parametrize("argv, message", [
    (["--sgrpo.verify_weight_sync", "-2"], "--sgrpo.verify_weight_sync must be 0 (off), N > 0 (the first N syncs) "
                                           "or -1 (every sync), got -2"),
    (["--sgrpo.verify_weight_sync", "1", "--vllm.tensor_parallel_size", "2"],
     "--sgrpo.verify_weight_sync 1 needs --vllm.tensor_parallel_size 1, got 2: each tensor-parallel worker holds "
     "a shard"),
    (["--sgrpo.verify_weight_sync", "-1", "--vllm.num_engines", "0"], "there is no engine to check"),
])
def test_bad_settings_are_refused_naming_the_value(argv, message):
    with pytest.raises(CliError) as exc:
        parse_config([*BASE, *argv])
    assert message in str(exc.value)


def test_tensor_parallel_engines_are_fine_with_the_check_off():
    assert parse_config([*BASE, "--vllm.tensor_parallel_size", "2"]).vllm.tensor_parallel_size == 2


def test_which_syncs_are_checked():
    assert [s for s in range(1, 6) if sync_is_checked(2, s)] == [1, 2]
    assert all(sync_is_checked(-1, s) for s in range(1, 100))
    assert not any(sync_is_checked(0, s) for s in range(1, 100))


def test_summary_lines_the_smoke_greps():
    ok = SyncCheck(sync=3, engines=[EngineCheck(equal=290, unreadable=0)], seconds=0.25)
    assert ok.ok and ok.summary() == "[sgrpo] weight sync 3 verified: engine 0: 290 tensors equal (0 unreadable) in 0.25 s"
    many = [f"t{i} (values differ)" for i in range(12)]
    bad = SyncCheck(sync=1, engines=[EngineCheck(equal=5, unreadable=2), EngineCheck(equal=3, unreadable=2,
                                                                                     differing=many)], seconds=1.0)
    line = bad.summary()
    assert not bad.ok and line.startswith("[sgrpo] weight sync 1 FAILED verification: engine 1: 12 of 15 readable")
    assert "t9 (values differ) ..." in line and "t10" not in line  # at most 10 named


def test_trainer_digests_equal_whole_tensor_digests_with_vocab_padding():
    """The trainer side on a tied tiny Qwen2: each engine form (a bf16 tensor, a bias held in fp32,
    an embedding padded by 64 rows) digests like the whole tensor built from engine_probe's map,
    cast once to the engine's dtype as a sync leaves it (the fp32 bias: the trainer's fp32 values,
    not rounded through bf16)."""
    from engine_probe import expected_engine_tensors

    from openrlhf_sgrpo import assets
    from openrlhf_sgrpo.engine.weight_check import tensor_digest

    model, _ = assets.tiny_qwen2(seed=5, layers=1)
    with torch.no_grad():  # biases with more bits than bf16 keeps, so the two roundings differ
        model.model.layers[0].self_attn.q_proj.bias.normal_(0.0, 0.1)
    expected = expected_engine_tensors(model)
    vocab, hidden = expected["model.embed_tokens.weight"].shape
    bf16, f32 = "torch.bfloat16", "torch.float32"
    wanted = {"model.layers.0.self_attn.qkv_proj.bias": {((128,), f32)},
              "model.layers.0.mlp.gate_up_proj.weight": {((256, 64), bf16)},
              "lm_head.weight": {((vocab + 64, hidden), bf16)}}
    ours = trainer_digests(model, wanted, SimpleNamespace(ds=SimpleNamespace(zero_stage=0)), digest=True)
    assert len(ours) == 3
    bias = expected["model.layers.0.self_attn.qkv_proj.bias"]
    qkv = ours[("model.layers.0.self_attn.qkv_proj.bias", (128,), f32)]
    assert qkv == ((128,), f32, tensor_digest(bias.float()))
    assert qkv[2] != tensor_digest(bias.bfloat16().float())
    gate_up = ours[("model.layers.0.mlp.gate_up_proj.weight", (256, 64), bf16)]
    assert gate_up[2] == tensor_digest(expected["model.layers.0.mlp.gate_up_proj.weight"].bfloat16())
    head = ours[("lm_head.weight", (vocab + 64, hidden), bf16)]
    padded = torch.cat([expected["model.embed_tokens.weight"].bfloat16(), torch.zeros(64, hidden, dtype=torch.bfloat16)])
    assert head == ((vocab + 64, hidden), bf16, tensor_digest(padded))
    # a rank that does not digest runs the same gathers and returns nothing
    assert trainer_digests(model, wanted, SimpleNamespace(ds=SimpleNamespace(zero_stage=0)), digest=False) == {}


def test_policy_actor_installs_the_check_after_the_cpu_sync(openrlhf_gpu_stubs):
    """Idempotent, and outermost: it wraps whichever sync ``broadcast_to_vllm`` runs."""
    import inspect

    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    from openrlhf_sgrpo.openrlhf_ext import actors
    from openrlhf_sgrpo.openrlhf_ext.cpu_weight_sync import install_cpu_weight_sync
    from openrlhf_sgrpo.openrlhf_ext.sync_verify import install_sync_verify

    init = inspect.getsource(actors.SGRPOPolicyModelActorImpl.__init__)
    assert init.index("install_cpu_weight_sync()") < init.index("install_sync_verify()")
    saved = ActorPPOTrainer.broadcast_to_vllm, dict(vars(ActorPPOTrainer))
    try:
        install_cpu_weight_sync()
        install_sync_verify()
        wrapped = ActorPPOTrainer.broadcast_to_vllm
        install_sync_verify()
        assert ActorPPOTrainer.broadcast_to_vllm is wrapped
        assert wrapped.__code__.co_filename.endswith("sync_verify.py")
        assert wrapped.__wrapped__.__code__.co_filename.endswith("cpu_weight_sync.py")
    finally:
        for name in set(vars(ActorPPOTrainer)) - set(saved[1]):
            delattr(ActorPPOTrainer, name)
        for name in ("broadcast_to_vllm", "_init_vllm_sync_group"):
            setattr(ActorPPOTrainer, name, saved[1][name])


def _gpu_smoke():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "gpu_smoke.py"
    spec = importlib.util.spec_from_file_location("gpu_smoke_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_summary_prints_the_checks_and_fails_on_a_failed_or_missing_one(capsys):
    """What ``scripts/gpu_smoke.py`` makes of a run's log: Ray's worker prefix dropped, a failure
    seen in two tracebacks printed once, and exit 1 when a check failed or none ran."""
    smoke = _gpu_smoke()
    ok = ("(PolicyModelActor pid=7) [sgrpo] weight sync 1 verified: engine 0: 272 tensors equal (0 unreadable) in 0.4 s\n"
          "step 2 ...\n"
          "(PolicyModelActor pid=7) [sgrpo] weight sync 2 verified: engine 0: 272 tensors equal (0 unreadable) in 0.3 s\n")
    assert smoke.sync_check_verdict(ok, "A") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[gpu_smoke] run A weight syncs checked by value: 2 verified, 0 failed"
    assert out[1] == "[gpu_smoke]   [sgrpo] weight sync 1 verified: engine 0: 272 tensors equal (0 unreadable) in 0.4 s"
    failure = "[sgrpo] weight sync 3 FAILED verification: engine 0: 1 of 272 readable tensors differ: model.norm.weight"
    bad = ok + f"(PolicyModelActor pid=7) RuntimeError: {failure}\nray.exceptions.RayTaskError: RuntimeError: {failure}\n"
    assert smoke.sync_check_verdict(bad, "B") == 1
    captured = capsys.readouterr()
    assert "2 verified, 1 failed" in captured.out and f"[gpu_smoke]   {failure}" in captured.out
    assert "run B: a sync failed its check" in captured.err
    assert smoke.sync_check_verdict("no checks here\n", "A") == 1
    assert "run A: no sync was checked" in capsys.readouterr().err
    # both vLLM runs ask for the check on every sync; the HF engine (refused with it) does not
    paths = {"data": "d", "policy": "p"}
    assert "--sgrpo.verify_weight_sync -1" in " ".join(smoke.cli_args(paths, smoke.REPO, "A", 2, "f"))
    assert "--sgrpo.verify_weight_sync -1" in " ".join(smoke.cli_args(paths, smoke.REPO, "B", 2, "f"))
    assert "--sgrpo.verify_weight_sync" not in " ".join(smoke.cli_args(paths, smoke.REPO, "A", 2, "f", engine="hf"))
