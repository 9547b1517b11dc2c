"""Search observations are byte-identical to Search-R1's (oracle: tests/peer_rules.py, restating
`_passages2string` and the `<information>` wrapper of search_r1/llm_agent/generation.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from peer_rules import search_r1_search_observation

from agent_env.observations import char_truncator, format_docs, information_block
from agent_env.tools.retriever import parse_retrieve_response
from openrlhf_sgrpo.assets import shared_data

CORPORA = [("wiki_corpus", "wiki18_sample1000.jsonl"), ("hotpotqa", "corpus_hipporag100.jsonl"),
           ("musique", "corpus_hipporag100.jsonl")]


def our_observation(hits: list[dict]) -> str:
    """What the agent shows for one `/retrieve` answer (Search-R1's `return_scores` shape), uncut."""
    (docs,) = parse_retrieve_response({"result": [hits]}, 1)
    return information_block(format_docs(docs), truncate=lambda text: text)


@pytest.mark.shared_data
@pytest.mark.parametrize("folder,name", CORPORA)
def test_every_passage_of_the_shared_corpora_renders_as_in_search_r1(folder, name):
    path = shared_data(folder, name)
    if not path.exists():
        pytest.skip(f"../shared/data absent: {folder}/{name} lives outside the repo")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for start in range(0, len(rows), 3):  # top-3, as Search-R1's default
        group = rows[start:start + 3]
        hits = [{"document": r, "score": 1.0 - 0.1 * k} for k, r in enumerate(group)]
        assert our_observation(hits) == search_r1_search_observation([r["contents"] for r in group]), group


def test_quoted_titles_stay_quoted():
    hits = [{"document": {"id": "7", "contents": '"Demon Dice"\nDemon Dice, originally published as ...'}}]
    assert our_observation(hits) == \
        '\n\n<information>Doc 1(Title: "Demon Dice") Demon Dice, originally published as ...</information>\n\n'


# Contents beyond the shared corpora's shape: no newline, several, blank lines, spaces at the ends.
contents = st.text(alphabet=st.sampled_from(list('ab "\n\t .é')), max_size=30)


@settings(max_examples=300, deadline=None)
@given(st.lists(contents, max_size=4))
def test_any_contents_render_as_in_search_r1(passages):
    hits = [{"document": {"id": str(i), "contents": c}, "score": 0.5} for i, c in enumerate(passages)]
    assert our_observation(hits) == search_r1_search_observation(passages)


def test_the_cap_cuts_inside_the_tags():
    """The one deliberate difference (docs/agent_env.md): Search-R1 cuts the whole tokenized
    observation, which can drop `</information>`; ours cuts the text between the tags (the token
    cut through the executor: tests/test_agent_episode.py::test_observations_are_cut_to_max_obs_tokens)."""
    body = " ".join(f"word{i}" for i in range(200))
    assert information_block(body, char_truncator(5)) == f"\n\n<information>{body[:20]}</information>\n\n"
    assert information_block(body, char_truncator(10_000)) == f"\n\n<information>{body}</information>\n\n"
