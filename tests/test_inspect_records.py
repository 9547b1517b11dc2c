"""Rollout records from real agent episodes: turn text rebuilt from token ranges, strata and
advantage terms, the cluster adapter on OpenRLHF's own experiences, and the writer/reader.

The episodes are real (OpenRLHF's executor + our agent, the real Qwen2 tokenizer, Search-R1
``/retrieve`` and SandboxFusion ``/run_code`` on loopback); only the policy's text is scripted,
at the engine boundary (``tests/scripted_rollouts.py``).
"""

from __future__ import annotations

import json
import random

import pytest
import scripted_rollouts as scripted
import torch
from agent_fakes import MiniToolServer

from agent_env import info_keys as K
from openrlhf_sgrpo import assets
from openrlhf_sgrpo.advantages import stratified_advantages
from openrlhf_sgrpo.rollout_records.build import SCHEMA_VERSION, RecordLimits
from openrlhf_sgrpo.rollout_records.sources import records_from_samples
from openrlhf_sgrpo.rollout_records.store import (
    RecordError,
    RolloutWriter,
    list_step_files,
    read_step_file,
    step_path,
)


@pytest.fixture(scope="module")
def tok():
    return assets.load_qwen2_tokenizer()


@pytest.fixture(scope="module")
def run(tok, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    return run_dir, scripted.scripted_run(run_dir, tok)


def _rounded(obj, places: int = 5):
    """Floats rounded (nested): OpenRLHF keeps rewards in other dtypes than the local runner."""
    if isinstance(obj, float):
        return round(obj, places)
    if isinstance(obj, dict):
        return {k: _rounded(v, places) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v, places) for v in obj]
    return obj


def _by_id(groups):
    return {g["prompt_id"]: g for g in groups}


def test_turn_text_is_the_policy_text_and_outputs_are_the_observations(run):
    run_dir, written = run
    step1 = _by_id(written["train/1"])
    for prompt in scripted.STEPS[0]:
        group = step1[prompt.qid]
        assert group["question"] == prompt.question and group["golds"] == prompt.golds
        for sample, script in zip(group["samples"], prompt.scripts):
            assert [t["text"] for t in sample["turns"]] == script  # decoded token ranges == what was generated
    france = step1["q-france"]["samples"]
    search = france[2]["turns"][0]
    assert (search["kind"], search["query"]) == ("search", "capital of France")
    assert search["output"].startswith('\n\n<information>Doc 1(Title: "Paris") Paris is the capital')
    assert search["output"].endswith("</information>\n\n") and search["doc_ids"] == [0, 1]
    assert france[2]["turns"][1]["start"] == search["start"] + search["tokens"] + search["output_tokens"]
    assert france[0]["turns"][0]["output"] == "" and france[0]["turns"][0]["query"] == "Paris"
    product = step1["q-product"]["samples"]
    assert product[0]["turns"][0]["kind"] == "code" and product[0]["turns"][0]["query"] == "print(6 * 7)"
    assert "<result>42\n</result>" in product[0]["turns"][0]["output"]
    none_turn = product[3]["turns"][0]
    assert none_turn["kind"] == "none" and none_turn["query"] is None
    assert "My previous action is invalid." in none_turn["output"] and product[3]["invalid_actions"] == 1


def test_strata_and_advantage_terms_match_the_estimator(run):
    _, written = run
    for key in ("train/1", "train/2"):
        groups = written[key]
        samples = [s for g in groups for s in g["samples"]]
        rewards = torch.tensor([s["reward"] for s in samples])
        strata = torch.tensor([s["tool_calls"] for s in samples])
        assert [s["stratum"] for s in samples] == strata.tolist()
        assert all(s["stratum_label"] == f"tool_calls={s['tool_calls']}" for s in samples)
        n = scripted.N_SAMPLES
        san = stratified_advantages(rewards, strata, n, alpha=1.0)
        gn = stratified_advantages(rewards, strata, n, alpha=0.0)
        blend = stratified_advantages(rewards, strata, n, alpha=scripted.ALPHA)
        assert [s["san"] for s in samples] == pytest.approx(san.tolist(), abs=1e-6)
        assert [s["gn"] for s in samples] == pytest.approx(gn.tolist(), abs=1e-6)
        assert [s["advantage"] for s in samples] == pytest.approx(blend.tolist(), abs=1e-6)
    hamlet = _by_id(written["train/1"])["q-hamlet"]
    assert {s["reward"] for s in hamlet["samples"]} == {0.0}  # no variance by construction
    assert all(s["advantage"] == s["san"] == s["gn"] == 0.0 for s in hamlet["samples"])
    assert len({s["stratum"] for s in _by_id(written["train/1"])["q-france"]["samples"]}) == 3


def test_token_advantages_and_calibadv_scores_land_on_their_turns(run):
    _, written = run
    france = _by_id(written["train/1"])["q-france"]["samples"]
    # sample 2 answered right after one search: its documents are the group's silver docs
    assert france[2]["turns"][0]["calib_score"] == 1.0
    # sample 3 is negative; its first search found only new silver docs, so CalibAdv softens
    # that turn's tokens to A * (1 - 1) = 0, while its second search (no new silver doc) keeps A
    wrong = france[3]
    assert wrong["advantage"] < 0 and wrong["turns"][0]["calib_score"] == 1.0
    assert wrong["turns"][0]["adv_mean"] == 0.0
    assert wrong["turns"][1]["calib_score"] == 0.0
    assert wrong["turns"][1]["adv_mean"] == pytest.approx(wrong["advantage"], abs=1e-6)
    # a positive sample without search keeps its advantage on every action token, up to the
    # per-group answer rebalancing (positive side scaled)
    assert france[0]["turns"][0]["adv_mean"] > 0


def test_eval_records_have_no_group_baseline(run):
    run_dir, written = run
    evals = written["eval/2"]
    assert [g["n"] for g in evals] == [1, 1] and all(g["dataset"] == "scripted" for g in evals)
    assert all(s["advantage"] is None and s["san"] is None and s["gn"] is None for g in evals for s in g["samples"])
    files = {(f.phase, f.step) for f in list_step_files(run_dir)}
    assert files == {("train", 1), ("train", 2), ("eval", 2)}


def test_records_roundtrip_through_files(run):
    run_dir, written = run
    for key, groups in written.items():
        phase, step = key.split("/")
        result = read_step_file(step_path(run_dir, phase, int(step)))
        assert result.warnings == [] and result.groups == json.loads(json.dumps(groups))
        assert all(g["schema_version"] == SCHEMA_VERSION for g in result.groups)


def test_limits_bound_tool_output_and_text(tok):
    with MiniToolServer(scripted.CORPUS) as srv:
        cfg = scripted.agent_config(srv)
        prompt = scripted.ScriptedPrompt("q", "capital?", ["Paris"], [[scripted.search("capital of France"),
                                                                      scripted.answer("Paris")]] * 2)
        responses = scripted.execute(cfg, tok, [prompt])
    from openrlhf_sgrpo.local.experience import tensorize_response

    samples = [tensorize_response(r, scripted.MAX_LEN) for r in responses]
    (group,) = records_from_samples(samples, tok, 2, phase="train", step=1, adv_cfg=scripted.adv_config(),
                                    limits=RecordLimits(text_chars=20, output_chars=30))
    turn = group["samples"][0]["turns"][0]
    assert len(turn["output"]) == 30 and turn["output_chars"] > 100 and len(turn["text"]) == 20
    assert turn["query"] == "capital of France"  # parsed from the whole text, not the cut one
    # max_len truncation: the answer turn falls past the end of the sequence
    prompt_len = group["samples"][0]["prompt_tokens"]
    short = [tensorize_response(r, prompt_len + 10) for r in responses]
    (cut,) = records_from_samples(short, tok, 2, phase="train", step=1, adv_cfg=scripted.adv_config())
    search_turn, answer_turn = cut["samples"][0]["turns"]
    assert search_turn["tokens"] == 10 and search_turn["clipped"] and answer_turn["tokens"] == 0


@pytest.mark.usefixtures("openrlhf_gpu_stubs")
def test_cluster_dump_of_openrlhf_experiences_matches_the_local_records(tok, tmp_path):
    """Real responses -> OpenRLHF's `_process_response_into_experience` -> shuffled micro-batches
    with `index` -> our experience maker (OpenRLHF's `compute_advantages_and_returns`) ->
    ``--sgrpo.dump_rollouts 2`` writes the first 2 groups, equal to the single-machine records of
    the same samples (the per-turn slots it needs leave ``info`` only after the dump)."""
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config
    from openrlhf_sgrpo.local.experience import tensorize_response
    from openrlhf_sgrpo.openrlhf_ext.config import sgrpo_options
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    n = scripted.N_SAMPLES
    prompts = scripted.STEPS[0]
    with MiniToolServer(scripted.CORPUS) as srv:
        responses = scripted.execute(scripted.agent_config(srv), tok, prompts)
    gen = object.__new__(SamplesGenerator)
    singles = [gen._process_response_into_experience(r, max_len=scripted.MAX_LEN) for r in responses]
    for i, e in enumerate(singles):
        e.index = [i]
    order = list(range(len(singles)))
    random.Random(3).shuffle(order)
    batches = [Experience.concat_experiences([singles[i] for i in order[k:k + 3]], tok.pad_token_id)
               for k in range(0, len(order), 3)]
    for b in batches:
        b.kl = torch.zeros_like(b.action_mask, dtype=torch.float32)
    args = parse_config(["--rollout.n_samples_per_prompt", str(n), "--algo.advantage.estimator", "stratified_grpo",
                         "--algo.advantage.sgrpo_alpha", "0.6", "--sgrpo.dump_rollouts", "2",
                         "--sgrpo.run_dir", str(tmp_path)])
    maker = StratifiedExperienceMaker(None, None, None, None, FixedKLController(0.0),
                                      type("S", (), {"args": args})(), tokenizer=tok)
    batches = maker.compute_advantages_and_returns(batches)
    opts = sgrpo_options(args)
    (dumped,) = list_step_files(tmp_path)
    assert (dumped.phase, dumped.step) == ("train", 1)
    got = read_step_file(dumped.path).groups
    samples = [tensorize_response(r, scripted.MAX_LEN) for r in responses]
    want = records_from_samples(samples, tok, n, phase="train", step=1, adv_cfg=opts, max_groups=2)
    assert [g["group"] for g in got] == [0, 1]
    strip = lambda gs: [{**g, "samples": [{**s, "turns": [{k: v for k, v in t.items() if k != "adv_mean"}
                                                          for t in s["turns"]]} for s in g["samples"]]} for g in gs]
    assert _rounded(strip(got)) == _rounded(strip(want))
    # token advantages came from experience.advantages: every turn's mean is the sample's advantage
    for s in (s for g in got for s in g["samples"]):
        assert all(t["adv_mean"] == pytest.approx(s["advantage"], abs=1e-5) for t in s["turns"])


def test_write_step_replaces_and_append_survives_a_torn_line(tmp_path):
    writer = RolloutWriter(tmp_path)
    group = {"schema_version": SCHEMA_VERSION, "phase": "train", "step": 1, "question": "q", "samples": []}
    path = writer.write_step("train", 1, [group, group])
    writer.write_step("train", 1, [group])  # a resumed run redoes step 1: replaced, not doubled
    assert len(read_step_file(path).groups) == 1 and not list(path.parent.glob(".*tmp"))
    eval_path = writer.append("eval", 0, [group])
    with open(eval_path, "a") as f:
        f.write('{"schema_version": 1, "phase": "ev')  # a crash mid-write
    torn = read_step_file(eval_path)
    assert len(torn.groups) == 1 and "incomplete last line" in torn.warnings[0]
    RolloutWriter(tmp_path).append("eval", 0, [group])  # a resumed evaluation cuts the torn tail first
    clean = read_step_file(eval_path)
    assert len(clean.groups) == 2 and clean.warnings == []


@pytest.mark.parametrize("line, message", [
    ("not json", ":2: not a JSON record"),
    ("[1, 2]", ":2: expected a JSON object"),
    ('{"phase": "train", "step": 1, "question": "q", "samples": []}', ":2: no integer schema_version"),
    ('{"schema_version": 99, "phase": "train", "step": 1, "question": "q", "samples": []}', "newer than"),
    ('{"schema_version": 1, "phase": "train", "step": 1, "question": "q", "samples": 3}', "'samples' must be"),
])
def test_reader_names_file_and_line_of_a_bad_record(tmp_path, line, message):
    path = step_path(tmp_path, "train", 1)
    path.parent.mkdir(parents=True)
    good = json.dumps({"schema_version": 1, "phase": "train", "step": 1, "question": "q", "samples": []})
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(RecordError, match=str(path).replace(".", r"\.") + ".*" if ":2:" in message else message) as err:
        read_step_file(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="phase must be"):
        RolloutWriter("/tmp").write_step("../x", 1, [])
    with pytest.raises(ValueError, match="output_chars must be >= 1"):
        RecordLimits(output_chars=0)
    with pytest.raises(ValueError, match="not a multiple of n_samples=4"):
        records_from_samples([object()] * 3, None, 4, phase="train", step=1)
    with pytest.raises(ValueError, match="need the run's advantage config"):
        records_from_samples([object()] * 4, None, 4, phase="train", step=1)


def test_info_row_turn_slots_are_the_contract(run):
    """The records read turns only through agent_env.info_keys (no private parsing)."""
    _, written = run
    sample = _by_id(written["train/1"])["q-france"]["samples"][3]
    assert [t["kind"] for t in sample["turns"]] == ["search", "search", "answer"]
    assert sample["turns"][0]["kind"] == K.KIND_NAMES[K.KIND_SEARCH]
    assert sample["tool_calls"] == sample["search_calls"] == 2 and sample["answered"] == 1
