"""The trap world's paths (openrlhf_sgrpo/demo/trap_paths.py): each of the imperfect expert's three
moves, written as the agent records it (queries parsed from the turn by the agent's own parser),
lands on its path; a second search of the aunt is "other"; counts, step fields and the CLI.
The real run's records are checked in tests/test_study.py (the CPU study's trap seed)."""

from __future__ import annotations

import json

import pytest

from agent_env.actions import SEARCH, parse_action
from openrlhf_sgrpo.demo import trap_paths, trap_task
from openrlhf_sgrpo.demo.synth_task import build_task

TRAP = build_task(n_train_pairs=60, n_heldout=8, seed=3, regime="trap")
TWO_HOP = [q for q in TRAP.train if q.n_hops == 2]


def recorded(turn_texts: list[str], em: float) -> dict:
    """A rollout record's sample as the agent writes it: per turn its kind and parsed query."""
    turns = [{"kind": a.kind, "text": t, "query": a.content} for t in turn_texts if (a := parse_action(t))]
    return {"turns": turns, "search_calls": sum(t["kind"] == SEARCH for t in turns), "em": em}


def test_each_expert_move_lands_on_its_path():
    want = {"one_search": "one_search", "good_bridge": "right_bridge", "wrong_bridge": "wrong_bridge"}
    seen = set()
    for q in TWO_HOP:
        turns, answer = trap_task.expert_script(q)
        plan = trap_task.expert_plan(q)
        assert trap_paths.classify(q, recorded(turns, float(answer == q.answer))) == want[plan], (q.qid, plan)
        seen.add(plan)
    assert seen == set(want)  # the world has every move
    q = TWO_HOP[0]
    aunt_again = [f"<think> x </think>\n<search> {q.hops[0].query} </search>",
                  f"<think> y </think>\n<search> {q.shortcut.answer} </search>", "<answer> z </answer>"]
    assert trap_paths.classify(q, recorded(aunt_again, 0.0)) == "other_second"
    both = [aunt_again[0], f"<search> {q.hops[1].query} or {q.decoy.query} </search>", "<answer> z </answer>"]
    assert trap_paths.classify(q, recorded(both, 0.0)) == "other_second"  # names both towns: no bridge
    loud = [aunt_again[0], f"<search>  {q.hops[1].query.upper()}  mayor </search>", "<answer> z </answer>"]
    assert trap_paths.classify(q, recorded(loud, 1.0)) == "right_bridge"
    assert trap_paths.classify(q, recorded(["<answer> z </answer>"], 0.0)) == "no_search"
    three = [aunt_again[0]] * 3 + ["<answer> z </answer>"]
    assert trap_paths.classify(q, recorded(three, 0.0)) == "three_plus"
    one_hop = next(q for q in TRAP.train if q.n_hops == 1)
    with pytest.raises(ValueError, match="not a two-hop question"):
        trap_paths.classify(one_hop, recorded(["<answer> z </answer>"], 0.0))


def test_counts_leave_out_one_hop_groups_and_step_fields_sum_to_one():
    questions = {q.qid: q for q in TRAP.train}
    a, b = TWO_HOP[:2]
    groups = [{"prompt_id": a.qid, "samples": [recorded(trap_task.expert_script(a)[0], 1.0),
                                                recorded(["<answer> z </answer>"], 0.0)]},
              {"prompt_id": b.qid, "samples": [recorded(trap_task.expert_script(b)[0], 0.0)]},
              {"prompt_id": next(q for q in TRAP.train if q.n_hops == 1).qid,
               "samples": [recorded(["<answer> z </answer>"], 1.0)]},
              {"prompt_id": "not-in-this-world", "samples": [recorded(["<answer> z </answer>"], 1.0)]}]
    counts = trap_paths.count_paths(questions, groups)
    assert sum(n for n, _ in counts.values()) == 3 and counts["no_search"] == [1, 0.0]
    fields = trap_paths.step_fields(counts)
    shares = {k: v for k, v in fields.items() if k.endswith("/share")}
    assert sum(shares.values()) == pytest.approx(1.0) and fields["path/no_search/share"] == pytest.approx(1 / 3)
    assert all(v > 0 for v in shares.values())  # a path nobody took is left out
    assert trap_paths.step_fields({slug: [0, 0.0] for slug, _ in trap_paths.PATHS}) == {}


def test_cli_names_a_folder_that_is_not_a_trap_run(tmp_path, capsys):
    with pytest.raises(SystemExit):
        trap_paths.main([str(tmp_path)])
    assert "no args.json" in capsys.readouterr().err
    (tmp_path / "args.json").write_text(json.dumps({"task": "search", "train_pairs": "200", "heldout": "48",
                                                    "task_seed": "0"}))
    assert trap_paths.main([str(tmp_path)]) == 2
    assert "not the trap world" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        trap_paths.main([str(tmp_path), "--window", "0"])
