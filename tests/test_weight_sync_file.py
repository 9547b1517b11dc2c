"""What the weight-sync file holds (openrlhf_sgrpo.engine.weight_sync.write_weights): every
distinct tensor once, a tied one once. Runs in a second; the engines' tests check what a sync
delivers into vLLM (tests/engine_probe.py)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from openrlhf_sgrpo.engine.weight_sync import write_weights


def saved(named, tmp_path) -> dict[str, torch.Tensor]:
    path = write_weights(named, tmp_path)
    try:
        return load_file(str(path))
    finally:
        path.unlink()


def test_every_parameter_of_a_model_is_written_and_a_tied_head_once(tmp_path):
    """A tied LM head shares the embedding's tensor: written once, under the first name. Every
    other parameter is written, with its values: the sync's contract with vLLM's reload."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), *[torch.nn.Linear(16, 16) for _ in range(60)],
                                torch.nn.Linear(16, 50, bias=False))
    model[-1].weight = model[0].weight  # tied
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    got = saved(model.named_parameters(remove_duplicate=False), tmp_path)
    tied = f"{len(model) - 1}.weight"
    assert tied in names and tied not in got
    assert sorted(got) == sorted(n for n in names if n != tied)
    for name, p in model.named_parameters():
        assert torch.equal(got[name], p.detach()), name


def test_tensors_freed_between_yields_are_not_taken_for_the_same_tensor(tmp_path):
    """Tensors the file holds copies of, yielded one at a time and dropped, free their Python ids
    and memory blocks for the next: none may be skipped. On CUDA every tensor is copied to the CPU,
    and with ``id()`` of the detached view as the key (before 2026-11-27) a random 10-20 % of each
    GPU sync went missing. Here the copy is forced by non-contiguous tensors (``.contiguous()``
    copies them), so the reuse happens on a CPU too."""
    def produced():
        for i in range(200):
            yield f"t{i}", torch.full((2, 8), float(i)).t()  # a fresh non-contiguous 8 x 2, then dropped

    got = saved(produced(), tmp_path)
    assert sorted(got) == sorted(f"t{i}" for i in range(200))
    assert all(torch.equal(got[f"t{i}"], torch.full((8, 2), float(i))) for i in range(200))


def test_views_of_one_flat_buffer_are_distinct_tensors(tmp_path):
    """Parameters that are slices of one flat buffer (a fused optimizer's layout) share a storage
    but not their memory: each is written."""
    flat = torch.arange(30.0)
    views = [("a", flat[0:10]), ("b", flat[10:20]), ("c", flat[20:30].view(2, 5))]
    got = saved(views, tmp_path)
    assert sorted(got) == ["a", "b", "c"] and torch.equal(got["c"], flat[20:30].view(2, 5))
