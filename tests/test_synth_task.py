"""The demo's generated search task: built deterministically, answers unique and unknowable
without search, held-out entities unseen in training, every hop's passage retrievable with the
demo's encoder (MiniLM, the real retriever on loopback), and a policy that cannot search scoring
EM <= 0.05 (SmolLM2 itself, made to answer at once).
"""

from __future__ import annotations

import pytest

from agent_env.actions import SEARCH, parse_action
from agent_env.observations import Doc, format_docs, information_block
from agent_env.rewards import is_valid_sequence
from openrlhf_sgrpo.demo.hops import by_hop, eval_by_hop
from openrlhf_sgrpo.demo.synth_task import (
    KINDS,
    build_task,
    entity_names,
    expert_turns,
    hop_of_qid,
    make_pairs,
    write_corpus,
)
from openrlhf_sgrpo.demo.task_checks import leaked_answers, mentions

TASK = build_task()


def test_same_seed_same_world_other_seed_other_world(tmp_path):
    again = build_task()
    assert again == TASK
    assert write_corpus(again, tmp_path / "a").read_bytes() == write_corpus(TASK, tmp_path / "b").read_bytes()
    assert build_task(seed=1).passages != TASK.passages


def test_every_name_and_name_word_is_unique():
    pairs = make_pairs(400, seed=3)
    names = entity_names(tuple(pairs))
    assert len({n.lower() for n in names}) == len(names)
    words = [w.lower() for n in names for w in n.split()]
    assert len(set(words)) == len(words)  # no first name shared by two people, no town named like a river


def test_answers_are_unique_and_held_out_facts_never_appear_in_training():
    held_answers = [q.answer for q in TASK.heldout]
    assert len(set(held_answers)) == len(held_answers)
    assert leaked_answers(TASK) == []
    train_text = " ".join(f"{q.question} {q.answer} {' '.join(expert_turns(q))}" for q in TASK.train)
    for name in entity_names(TASK.heldout_pairs):
        assert not mentions(train_text, name), name
    assert not {q.qid for q in TASK.train} & {q.qid for q in TASK.heldout}
    # training searches the train pairs' passages only: no held-out fact, not even as a distractor
    train_corpus = " ".join(f"{t} {text}" for t, text in TASK.train_passages())
    assert len(TASK.train_passages()) == 2 * len(TASK.train_pairs)
    for name in entity_names(TASK.heldout_pairs):
        assert not mentions(train_corpus, name), name


def test_held_out_is_half_two_hop_and_train_is_half_two_hop():
    hops = [q.n_hops for q in TASK.heldout]
    assert hops.count(2) == len(hops) // 2 and hops.count(1) == len(hops) - len(hops) // 2
    assert sum(q.n_hops == 2 for q in TASK.train) * 2 == len(TASK.train)
    assert {q.kind for q in TASK.train} == set(KINDS)


def test_two_hop_chain_needs_the_first_answer_for_the_second_query():
    passages = dict(TASK.passages)
    for q in TASK.heldout + TASK.train:
        assert hop_of_qid(q.qid) == q.n_hops
        for hop in q.hops:
            assert hop.answer in passages[hop.title]  # each hop's fact is in its own passage
        if q.n_hops == 2:
            first, second = q.hops
            assert second.query == first.answer  # the bridge: the second query is the first answer
            assert second.query not in q.question  # ... which the question never names
            person = first.query
            assert person in q.question and person not in passages[second.title]
            assert q.answer not in passages[first.title]  # one search cannot read the answer


def test_expert_turns_are_valid_search_r1_trajectories():
    for q in (TASK.heldout[0], TASK.heldout[-1]):
        turns = expert_turns(q)
        assert len(turns) == q.n_hops + 1
        transcript = ""
        for hop, turn in zip(q.hops, turns):
            action = parse_action(turn)
            assert action.kind == SEARCH and action.content == hop.query
            transcript += turn + information_block(format_docs([Doc("0", hop.title, "text")]), lambda s: s)
        transcript += turns[-1]
        assert parse_action(turns[-1]).content == q.answer
        assert is_valid_sequence(transcript)  # so the format reward counts it as well formed


def test_by_hop_summary():
    rows = [{"id": "h1-a", "em": 1.0, "f1": 1.0, "search_calls": 1, "answered": 1},
            {"id": "h2-b", "em": 1.0, "f1": 1.0, "search_calls": 2, "answered": 1},
            {"id": "h2-c", "em": 0.0, "f1": 0.5, "search_calls": 1, "answered": 1},
            {"id": "h2-d", "em": 0.0, "f1": 0.0, "search_calls": 0, "answered": 0}]
    s = eval_by_hop(rows)
    assert s["n"] == 4 and s["hop1/n"] == 1 and s["hop2/n"] == 3
    assert s["hop2/em"] == pytest.approx(1 / 3) and s["hop2/f1"] == pytest.approx(0.5)
    assert s["hop2/two_search_share"] == pytest.approx(1 / 3) and s["hop2/search_calls"] == pytest.approx(1.0)
    assert s["answered"] == pytest.approx(0.75) and s["hop1/search_calls"] == 1.0
    plain = by_hop([{"em": 1.0}], lambda r: None)  # another dataset's ids: one "all" row, no hop keys
    assert plain["em"] == 1.0 and not any(k.startswith("hop") for k in plain)


@pytest.fixture(scope="module")
def retriever_url():
    from openrlhf_sgrpo.assets import cache_dir
    from openrlhf_sgrpo.local.services import cached_index_for, local_services

    index = cached_index_for(write_corpus(TASK, cache_dir() / "demo"), progress=False)
    with local_services(index, sandbox=False) as urls:
        yield urls.retriever_url


@pytest.mark.slow
def test_each_hop_passage_is_in_the_top3_for_its_natural_query(retriever_url):
    """The demo's encoder and index over HTTP: every held-out hop's passage comes back for the
    entity name (the query the warm-up teaches); the whole question finds the first hop too; and
    one search does not reach a two-hop question's answer passage."""
    from openrlhf_sgrpo.demo.task_checks import measure_recall

    recall = measure_recall(retriever_url, list(TASK.heldout), k=3)
    assert recall.n_two_hop == 24 and recall.n_one_hop == 24
    assert recall.hop1 == 1.0 and recall.hop2 == 1.0, recall
    assert recall.question_as_query >= 0.95, recall
    assert recall.two_hop_in_one_search <= 0.05, recall


@pytest.mark.slow
def test_a_policy_that_cannot_search_scores_at_most_005():
    """SmolLM2-135M-Instruct, made to answer at once after the demo's prompt: its memory holds none
    of these made-up names (the same check the demo prints as 'closed-book')."""
    from agent_env.templates import build_prompt
    from openrlhf_sgrpo.demo.task_checks import closed_book
    from openrlhf_sgrpo.local.models import load_policy

    model, tok = load_policy("smollm2")
    result = closed_book(model, tok, list(TASK.heldout), lambda q: build_prompt("search_r1_chat", q, tok))
    assert result["n"] == 48
    assert result["em"] <= 0.05, result
