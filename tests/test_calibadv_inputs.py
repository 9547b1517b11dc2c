"""CalibAdv's inputs from real agent episodes: each search turn's think similarity and the format
verdict, computed by the agent and carried in ``extra_logs`` into both experience makers.

The similarity and the format check restate the rules of CalibAdv's authors
(github.com/wujwyi/CalibAdv, ``verl/trainer/main_ppo_format.py`` and Search-R1's
``qa_em_format.py``, read, not copied). Episodes run through OpenRLHF's real executor (our
``AgentExecutor``) with the real Qwen2 tokenizer, a scripted policy text and tools on a real
loopback HTTP server (tests/agent_fakes.py); the experiences come from OpenRLHF's own
``SamplesGenerator._process_response_into_experience`` (vllm/flash_attn imports stood in for by
``openrlhf_sgrpo.testing``, as in the other OpenRLHF tests).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from agent_fakes import MiniToolServer, run_scripted_episodes

from agent_env import info_keys as K
from agent_env.config import config_from_dict
from agent_env.think import think_text, word_similarity
from openrlhf_sgrpo import assets

MAX_LEN = 2048
GROUP = 4


@pytest.fixture(scope="module")
def tok():
    return assets.load_qwen2_tokenizer()


def run(cfg, tok, scripts: list[list[str]], label: str = '["Paris"]') -> list[dict]:
    return run_scripted_episodes(cfg, tok, scripts, label, "Where is the Louvre?", MAX_LEN)


def agent_config(srv: MiniToolServer, **overrides):
    return config_from_dict({"retriever_url": srv.url("/retrieve"), "retries": 1, "backoff_s": 0.01,
                             "request_timeout_s": 5, **overrides})


def think(text: str) -> str:
    return f"<think>{text}</think>\n"


def search(query: str, why: str) -> str:
    return think(why) + f"<search> {query} </search>"


def answer(text: str, why: str = "I know enough now.") -> str:
    return think(why) + f"<answer> {text} </answer>"


# ------------------------------------------------------------------ the measure itself

@pytest.mark.parametrize("a, b, want", [
    ("a b c d", "a b c d", 1.0),
    ("a b c d", "a b c e", 0.75),  # one word replaced, of 4
    ("a b c d", "a b c", 0.75),  # one word deleted: divided by the LONGER text's 4 words
    ("a b c d", "a b x y", 0.5),  # exactly the threshold (not "more than")
    ("a b", "b a", 0.0),  # a swap is two edits (plain Levenshtein, no transposition)
    ("x\ny\tz ", " x y z", 1.0),  # words are split on any whitespace
    ("The cat", "the cat", 0.5),  # case matters
    ("Paris.", "Paris", 0.0),  # punctuation is part of the word
    ("", "", 0.0),  # two empty thinks are not alike
    ("", "a b", 0.0),
])
def test_word_similarity_is_one_minus_word_edit_distance_over_the_longer(a, b, want):
    assert word_similarity(a, b) == pytest.approx(want)
    assert word_similarity(b, a) == pytest.approx(want)


def test_think_text_of_a_turn():
    assert think_text("<think> look it up </think>\n<search> q </search>") == " look it up "
    assert think_text("the prompt opened it</think><search> q </search>") == "the prompt opened it"
    assert think_text("<think>one</think> x <think>two</think><answer>y</answer>") == "one two"
    assert think_text("<search> q </search>") == ""


# ------------------------------------------------------------------ what the agent emits

def test_agent_emits_each_search_turns_highest_similarity_to_an_earlier_one(tok):
    with MiniToolServer([{"id": "0", "contents": '"Paris"\nParis.'}]) as srv:
        (res,) = run(agent_config(srv, max_turns=4), tok, [[
            search("capital France", "I should look up the capital of France"),
            search("capital Germany", "I should look up the capital of Germany"),  # 1 word of 8 differs
            search("Berlin", "Maybe Berlin is relevant"),  # no word in common with either: 0
            search("Louvre", "I should look up the capital of Germany today"),  # 1 insertion from turn 1
            answer("Paris", "I should look up the capital of France")]])  # answer turns are not compared
    meta = res["extra_logs"]
    sims = [meta[K.turn_think_sim_key(k)] for k in range(5)]
    assert sims == pytest.approx([-1.0, 7 / 8, 0.0, 8 / 9, -1.0])
    assert all(isinstance(v, float) for v in sims)  # one dtype per key across samples


@pytest.mark.parametrize("script, answered, format_ok", [
    ([search("capital of France", "Look it up."), answer("Paris")], 1, 1),
    ([answer("Paris")], 1, 0),  # no search
    (["<search> capital of France </search>", answer("Paris")], 1, 0),  # no <think> before the search
    ([search("capital of France", "Look it up."), "Paris it is. " + answer("Paris")], 1, 0),  # stray text
    ([search("capital of France", "Look it up."), "<search></search>", answer("Paris")], 1, 0),  # invalid action
    ([search("capital of France", "Look it up.")] * 3, 0, 0),  # out of turns, no answer
])
def test_agent_format_verdict_is_the_authors_check(tok, script, answered, format_ok):
    """Search-R1's structure (think, then search -> information -> think, ..., then answer, nothing
    else between the tags), at least one search, no invalid action, an answer. The project's
    earlier verdict (answered, no invalid action) passed the first four."""
    with MiniToolServer([{"id": "0", "contents": '"Paris"\nParis.'}]) as srv:
        (res,) = run(agent_config(srv, max_turns=2), tok, [script])
    meta = res["extra_logs"]
    assert (meta[K.ANSWERED], meta[K.FORMAT_OK]) == (answered, format_ok)


# ------------------------------------------------------------------ end to end into CalibAdv

# Word-overlap retrieval (tests/agent_fakes.py), top 2, ties in corpus order.
CORPUS = [
    {"id": "lyon", "contents": '"Lyon"\nLyon city.'},
    {"id": "nice", "contents": '"Nice"\nNice riviera.'},
    {"id": "paris", "contents": '"Paris"\nParis capital France.'},
    {"id": "louvre", "contents": '"Louvre"\nLouvre museum Paris.'},
]
SAME = "I need the city of this museum."
SCRIPTS = [
    # right, well formatted: its documents (paris, louvre) are the silver ones
    [search("paris capital", "Start from the capital."), answer("Paris")],
    # wrong, well formatted: turn 0 finds paris (s = 1/2); turn 1 finds louvre, new and silver,
    # but thinks the same thought again (similarity 1 > 0.5): s = 0
    [search("capital lyon", SAME), search("louvre nice", SAME), answer("Lyon")],
    # wrong, no <think> (format fails): finds both silver documents, but is not calibrated
    ["<search> paris capital </search>", answer("Nice")],
    # right but ill-formatted: its documents (lyon, nice) are not silver
    ["<search> lyon nice </search>", answer("Paris")],
]


@pytest.fixture(scope="module")
def responses(tok):
    with MiniToolServer(CORPUS) as srv:
        return run(agent_config(srv, topk=2, reward="em"), tok, SCRIPTS)


def _turn_columns(response: dict, k: int) -> slice:
    start, end = response["action_ranges"][k]
    return slice(start - 1, end - 1)  # action-mask column j is token j + 1


def _check_calibrated(responses: list[dict], base: list[torch.Tensor], calibrated: list[torch.Tensor]) -> None:
    """The rules on the four scripted rollouts, read off the token advantages."""
    a = [float(b[_turn_columns(r, 0)][0]) for r, b in zip(responses, base)]
    assert a[0] > 0 and a[3] > 0 and a[1] < 0 and a[2] < 0
    turn = lambda i, k: calibrated[i][_turn_columns(responses[i], k)]
    torch.testing.assert_close(turn(1, 0), torch.full_like(turn(1, 0), a[1] * 0.5))  # s = 1/2
    torch.testing.assert_close(turn(1, 1), torch.full_like(turn(1, 1), a[1]))  # repeated think: s = 0
    torch.testing.assert_close(turn(2, 0), torch.full_like(turn(2, 0), a[2]))  # format fails: kept


def test_inputs_arrive_through_extra_logs_in_openrlhfs_experience_maker(responses, openrlhf_gpu_stubs):
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    gen = object.__new__(SamplesGenerator)

    def experiences():
        exps = [gen._process_response_into_experience(r, max_len=MAX_LEN) for r in responses]
        for i, e in enumerate(exps):
            e.index, e.kl = [i], torch.zeros(e.action_mask.shape)
        return exps

    exps = experiences()
    assert [e.info[K.FORMAT_OK].item() for e in exps] == [1, 1, 0, 0]
    assert [e.rewards.item() for e in exps] == [1.0, 0.0, 0.0, 1.0]
    assert exps[1].info[K.turn_think_sim_key(1)].item() == 1.0
    assert exps[1].info[K.turn_think_sim_key(0)].item() == -1.0

    def advantages(*flags):
        args = parse_config(["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt",
                             str(GROUP), *flags])
        maker = StratifiedExperienceMaker(None, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args),
                                          tokenizer=None)
        return [e.advantages[0] for e in maker.compute_advantages_and_returns(experiences())]

    _check_calibrated(responses, advantages(), advantages("--algo.calibadv.enable"))


def test_inputs_arrive_through_extra_logs_in_the_local_runner(responses):
    from openrlhf_sgrpo.calibadv import CalibAdvConfig
    from openrlhf_sgrpo.local.experience import collate, tensorize_response
    from openrlhf_sgrpo.local.experience_maker import (
        AdvantageConfig,
        apply_calibadv,
        sample_advantages,
        token_advantages,
    )

    samples = [tensorize_response(r, MAX_LEN) for r in responses]
    adv = sample_advantages(samples, GROUP, AdvantageConfig(estimator="grpo", calibadv=CalibAdvConfig()))
    mask = collate(samples, 0).action_mask
    base = token_advantages(adv.advantages, mask)
    calibrated, stats = apply_calibadv(base, mask, samples, adv.advantages, GROUP, CalibAdvConfig())
    _check_calibrated(responses, list(base), list(calibrated))
    assert stats["calibadv/scored_share"] == 0.5
