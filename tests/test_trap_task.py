"""The trap regime of the generated task (demo/trap_task.py): one search pays for exactly half of
the people through a shortcut nothing in the text tells apart, the wrong bridge never pays, the
warm-up's imperfect expert makes the plans it is said to make, nothing held-out reaches
training, and the strata check's numbers (share, EM, Wilson interval) are what a hand count
gives."""

from __future__ import annotations

import re

import pytest

from agent_env.actions import SEARCH, parse_action
from agent_env.observations import Doc, format_docs, information_block
from agent_env.rewards import exact_match, is_valid_sequence
from openrlhf_sgrpo.demo import strata_check, trap_task
from openrlhf_sgrpo.demo.synth_task import PERSON_TEXT, build_task, entity_names
from openrlhf_sgrpo.demo.task_checks import leaked_answers, mentions

TRAP = build_task(regime="trap")
SEARCH_WORLD = build_task()


def test_the_trap_is_the_default_world_plus_its_facts():
    assert build_task(regime="trap") == TRAP  # a pure function of the seed
    two = lambda task: [q.question for q in (*task.train, *task.heldout) if q.n_hops == 2]  # noqa: E731
    assert two(TRAP) == two(SEARCH_WORLD)  # the same two-hop questions, the same people and towns
    # its one-hop questions name a town: none reads like a two-hop one ("... where X was born?")
    assert {q.kind for q in (*TRAP.train, *TRAP.heldout) if q.n_hops == 1} == set(trap_task.TRAP_ONE_HOP)
    assert all("born" not in q.question for q in (*TRAP.train, *TRAP.heldout) if q.n_hops == 1)
    default_people = dict(SEARCH_WORLD.passages)
    for pair in SEARCH_WORLD.train_pairs[:5]:  # the default world's passages are unchanged
        assert default_people[pair.person] == PERSON_TEXT.format(person=pair.person, job=pair.job, town=pair.town)
    with pytest.raises(ValueError, match="unknown task regime 'maze'"):
        build_task(regime="maze")


@pytest.mark.parametrize("side", ["train_pairs", "heldout_pairs"])
def test_exactly_half_of_each_side_get_a_shortcut_that_pays(side):
    pairs = getattr(TRAP, side)
    towns = {p.town: p for p in pairs}
    right = [p for p in pairs if p.aunt == p.mayor]
    assert len(right) == round(trap_task.SHORTCUT_RIGHT * len(pairs))
    for p in pairs:
        assert p.works_in in towns and p.works_in != p.town  # the wrong bridge is a town of the same side
        assert (p.grew_up_by == p.river) == (p.aunt == p.mayor)  # both shortcuts pay, or neither
        if p.aunt != p.mayor:  # a misleading shortcut belongs to a third town of the same side
            owner = next(q for q in pairs if q.mayor == p.aunt)
            assert owner.town not in (p.town, p.works_in) and owner.river == p.grew_up_by


def test_nothing_in_the_text_tells_a_paying_shortcut_from_a_misleading_one():
    template = re.compile(r"^(?P<person>.+) is a \w+ who was born in the town of \w+ and works in \w+\. "
                          r"(?P=person)'s aunt .+ is a mayor, and (?P=person) grew up by the \w+ river\.$")
    people = {p.person for p in (*TRAP.train_pairs, *TRAP.heldout_pairs)}
    texts = [text for title, text in TRAP.passages if title in people]
    assert len(texts) == len(people) and all(template.match(t) for t in texts)


def test_two_hop_questions_carry_the_shortcut_and_the_wrong_bridge():
    passages = dict(TRAP.passages)
    two_hop = [q for q in (*TRAP.train, *TRAP.heldout) if q.n_hops == 2]
    paid = 0
    for q in two_hop:
        person = q.hops[0].title
        assert q.shortcut.title == person and q.shortcut.answer in passages[person]  # one search shows it
        assert q.decoy.answer in passages[q.decoy.title] and q.decoy.title in passages[person]
        assert not exact_match(q.decoy.answer, [q.answer])  # the wrong bridge never pays
        assert q.answer not in passages[person] or exact_match(q.shortcut.answer, [q.answer])
        paid += exact_match(q.shortcut.answer, [q.answer])
    assert 0.35 < paid / len(two_hop) < 0.65  # about half of the questions (exactly half of the people)
    assert all(q.shortcut is None and q.decoy is None for q in TRAP.train if q.n_hops == 1)
    assert trap_task.rl_questions(list(TRAP.train)) == [q for q in TRAP.train if q.n_hops == 2]


def test_held_out_names_never_reach_training():
    assert leaked_answers(TRAP) == []
    scripts = " ".join(" ".join(trap_task.expert_script(q)[0]) for q in TRAP.train)
    corpus = " ".join(f"{t} {text}" for t, text in TRAP.train_passages())
    for name in entity_names(TRAP.heldout_pairs):
        assert not mentions(scripts, name) and not mentions(corpus, name), name


def test_the_imperfect_expert_makes_the_plans_it_is_said_to_make():
    two_hop = [q for q in TRAP.train if q.n_hops == 2]
    plans = [trap_task.expert_plan(q) for q in two_hop]
    assert plans == [trap_task.expert_plan(q) for q in two_hop]  # fixed by the question, no global RNG
    one = plans.count("one_search") / len(plans)
    good = plans.count("good_bridge") / max(1, len(plans) - plans.count("one_search"))
    assert abs(one - trap_task.ONE_SEARCH_SHARE) < 0.1 and abs(good - trap_task.GOOD_BRIDGE_SHARE) < 0.12
    for q in two_hop[:12]:
        turns, answer = trap_task.expert_script(q)
        plan = trap_task.expert_plan(q)
        queries = [parse_action(t).content for t in turns[:-1]]
        assert all(parse_action(t).kind == SEARCH for t in turns[:-1])
        expected = {"one_search": ([q.hops[0].query], q.shortcut.answer),
                    "good_bridge": ([h.query for h in q.hops], q.answer),
                    "wrong_bridge": ([q.hops[0].query, q.decoy.query], q.decoy.answer)}[plan]
        assert (queries, answer) == expected and parse_action(turns[-1]).content == answer
        transcript = "".join(t + information_block(format_docs([Doc("0", "t", "x")]), lambda s: s)
                             for t in turns[:-1]) + turns[-1]
        assert is_valid_sequence(transcript)
    # the search-necessary world's expert is the perfect one
    q = next(q for q in SEARCH_WORLD.train if q.n_hops == 2)
    assert trap_task.expert_plan(q) == "good_bridge" and trap_task.expert_script(q)[1] == q.answer


def test_a_side_needs_three_pairs():
    with pytest.raises(ValueError, match=">= 3 pairs per side"):
        build_task(n_train_pairs=10, n_heldout=2, regime="trap")


def test_strata_check_counts_and_wilson_interval():
    rows = [(1, 1.0)] * 5 + [(1, 0.0)] * 5 + [(2, 1.0)] * 2 + [(2, 0.0)] * 6 + [(0, 0.0)] * 2
    check = strata_check.summarize(rows)
    assert check["n"] == 20 and set(check["strata"]) == {"0", "1", "2"}
    one, two = check["strata"]["1"], check["strata"]["2"]
    assert (one["n"], one["share"], one["em"]) == (10, 0.5, 0.5)
    assert (two["n"], two["share"], two["em"]) == (8, 0.4, 0.25)
    # Wilson's 95 % interval for 5 of 10, by the textbook formula: 0.2366 .. 0.7634
    assert one["em_lo"] == pytest.approx(0.2366, abs=1e-4) and one["em_hi"] == pytest.approx(0.7634, abs=1e-4)
    assert strata_check.wilson(0, 4)[0] == 0.0 and strata_check.wilson(4, 4)[1] == 1.0
    assert strata_check.stratum_of(5) == "3plus"
    assert "1 search: share 0.50, EM 0.50" in strata_check.describe({**check, "questions": 5,
                                                                     "samples_per_question": 4})


@pytest.fixture(scope="module")
def trap_retriever_url():
    from openrlhf_sgrpo.assets import cache_dir
    from openrlhf_sgrpo.demo.synth_task import write_corpus
    from openrlhf_sgrpo.local.services import cached_index_for, local_services

    index = cached_index_for(write_corpus(TRAP, cache_dir() / "demo"), progress=False)
    with local_services(index, sandbox=False) as urls:
        yield urls.retriever_url


@pytest.mark.slow
def test_every_passage_the_trap_reads_is_retrieved_by_its_query(trap_retriever_url):
    """The demo's own encoder and index over HTTP: the shortcut's passage (the person), the right
    bridge and the wrong one each come back in the top 3 for the query the expert writes."""
    from openrlhf_sgrpo.demo.task_checks import retrieve_titles

    two_hop = [q for q in TRAP.heldout if q.n_hops == 2]
    for hop in ("first", "bridge", "decoy"):
        pick = {"first": lambda q: q.hops[0], "bridge": lambda q: q.hops[1], "decoy": lambda q: q.decoy}[hop]
        titles = retrieve_titles(trap_retriever_url, [pick(q).query for q in two_hop])
        hits = sum(pick(q).title in t for q, t in zip(two_hop, titles)) / len(two_hop)
        assert hits >= 0.95, (hop, hits)


def test_the_shortcut_plan_is_not_a_one_hop_plan():
    """A 135M policy whose one-search plan on a two-hop question read like a one-hop question's
    ("One search: X.") answered with the birth town; the shortcut's plan names what it reads."""
    q = next(q for q in TRAP.train if q.n_hops == 2 and trap_task.expert_plan(q) == "one_search")
    plan = trap_task.expert_script(q)[0][0]
    what = "the aunt" if q.kind.startswith("mayor") else "the river"
    assert plan.startswith(f"<think> One search: {q.hops[0].query}, then {what}. </think>")
    born = next(q for q in SEARCH_WORLD.train if q.kind == "born")
    assert trap_task.expert_script(born)[0][0].startswith(f"<think> One search: {born.hops[0].query}. </think>")


def test_fresh_rl_questions_leave_out_the_demonstrated_ones(capsys):
    from openrlhf_sgrpo.demo.options import parse_args
    from openrlhf_sgrpo.demo.questions import load_demo_data

    args = parse_args(["--task", "trap", "--demos", "128", "--fresh-rl-questions", "--out", "unused"])
    data = load_demo_data(args)
    demonstrated = {q.question for q in TRAP.train[:128]}
    rl = {q.question for q in data.train}
    assert rl and not rl & demonstrated
    assert rl == {q.question for q in TRAP.train[128:] if q.n_hops == 2}
    assert "RL trains on the 272 training questions the warm-up did not demonstrate" in capsys.readouterr().out
    default = load_demo_data(parse_args(["--task", "trap", "--out", "unused"]))
    assert {q.question for q in default.train} >= demonstrated & {q.question for q in TRAP.train if q.n_hops == 2}
