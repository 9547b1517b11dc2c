"""Strata keys from Experience.info scalars."""

from __future__ import annotations

import pytest
import torch

from openrlhf_sgrpo.strata import parse_stratify_by, strata_from_info


def test_single_key_and_cap():
    info = {"tool_calls": torch.tensor([0, 1, 2, 5, 7])}
    assert strata_from_info(info).tolist() == [0, 1, 2, 5, 7]
    assert strata_from_info(info, cap=2).tolist() == [0, 1, 2, 2, 2]


def test_float_and_bool_like_counts_from_openrlhf_info():
    # OpenRLHF turns extra_logs scalars into tensors: ints may arrive as floats
    info = {"search_calls": torch.tensor([0.0, 3.0, 1.0])}
    assert strata_from_info(info, "search_calls").dtype == torch.int64
    assert strata_from_info(info, "search_calls").tolist() == [0, 3, 1]


def test_signature_key_gives_one_id_per_pair():
    info = {"search_calls": torch.tensor([0, 1, 1, 2, 0]), "code_calls": torch.tensor([0, 0, 1, 1, 1])}
    ids = strata_from_info(info, ("search_calls", "code_calls"))
    pairs = list(zip(info["search_calls"].tolist(), info["code_calls"].tolist()))
    assert len(set(ids.tolist())) == len(set(pairs))
    for i in range(5):
        for j in range(5):
            assert (ids[i] == ids[j]) == (pairs[i] == pairs[j])
    assert torch.equal(strata_from_info(info, "search_calls,code_calls"), ids)


def test_signature_with_cap_uses_fixed_radix():
    info = {"a": torch.tensor([0, 9, 1]), "b": torch.tensor([4, 0, 1])}
    assert strata_from_info(info, "a,b", cap=2).tolist() == [0 * 3 + 2, 2 * 3 + 0, 1 * 3 + 1]


def test_missing_key_names_the_agent_and_available_keys():
    with pytest.raises(KeyError, match=r"no 'tool_calls'.*agent_env\.openrlhf_agent\.AgentExecutor.*reward"):
        strata_from_info({"reward": torch.tensor([1.0])})


@pytest.mark.parametrize("info, match", [
    ({"tool_calls": torch.tensor([0.5, 1.0])}, "integer counts"),
    ({"tool_calls": torch.tensor([-1, 1])}, "non-negative"),
])
def test_bad_counts(info, match):
    with pytest.raises(ValueError, match=match):
        strata_from_info(info)


@pytest.mark.parametrize("spec", ["", " , ", ","])
def test_bad_spec(spec):
    with pytest.raises(ValueError, match="stratify_by"):
        parse_stratify_by(spec)


def test_bad_cap():
    with pytest.raises(ValueError, match="cap must be a positive int"):
        strata_from_info({"tool_calls": torch.tensor([1])}, cap=0)
