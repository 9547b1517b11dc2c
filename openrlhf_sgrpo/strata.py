"""Strata keys: turn per-sample info scalars (tool_calls, search_calls, ...) into int64 ids.

The agent writes cumulative integer counts into ``extra_logs``; OpenRLHF stores each as a
``[B]`` tensor in ``Experience.info``. A stratum is either one count (``"tool_calls"``), an
optionally capped count (counts >= cap merge, useful when long tails leave singleton strata),
or a per-tool *signature* such as ``("search_calls", "code_calls")`` combined into one id.

The paper's random-strata control (Table 7) asks whether the *structure* of the strata matters
or only their number and sizes. :func:`parse_strata_spec` reads two random specs besides the
structural ones, and :func:`batch_strata` builds the ids of any spec:

- ``random:KEYS`` (e.g. ``random:tool_calls``): the strata of KEYS, with membership shuffled
  inside each prompt group, so every group keeps its strata *sizes* and loses their meaning;
- ``random_k:K``: K random strata per group of (as near as possible) equal sizes.

Random ids are drawn from a ``torch.Generator`` the caller seeds from the run seed and step
(:func:`strata_generator`), never from the global RNG: the rollout's sampling stays untouched
and a rerun draws the same strata.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_STRATIFY_BY = "tool_calls"
EMITTING_AGENT = "agent_env.openrlhf_agent.AgentExecutor (loaded with --train.agent_func_path)"
RANDOM_SHUFFLE = "random"  # random:KEYS
RANDOM_K = "random_k"  # random_k:K
STRATA_SPEC_FORMS = "KEY[,KEY...] | random:KEY[,KEY...] | random_k:K"
# Mixed into the step seed so the strata draws never share a stream with the rollout's or the
# mini-batch order's generator seeded from the same step seed.
_STRATA_SEED_SALT = 0x57A7A


@dataclass(frozen=True)
class StrataSpec:
    """A parsed ``stratify_by``: the info keys it reads and how it turns them into strata.

    ``keys`` are the structural keys (empty for ``random_k``); ``shuffle`` permutes their strata
    inside each group; ``random_k`` ignores them and deals K balanced random strata.
    """

    keys: tuple[str, ...]
    shuffle: bool = False
    random_k: int | None = None

    @property
    def is_random(self) -> bool:
        return self.shuffle or self.random_k is not None

    @property
    def structural_keys(self) -> tuple[str, ...]:
        """The keys whose strata describe the samples' structure (random_k: the default key)."""
        return self.keys or (DEFAULT_STRATIFY_BY,)


def _parse_keys(spec: Any, keys_text: str | Sequence[str]) -> tuple[str, ...]:
    keys = tuple(k.strip() for k in (keys_text.split(",") if isinstance(keys_text, str) else keys_text))
    if not keys or any(not k or ":" in k for k in keys):
        raise ValueError(f"stratify_by must be one of {STRATA_SPEC_FORMS} (info keys comma-separated), "
                         f"got {spec!r}")
    return keys


def parse_strata_spec(spec: str | Sequence[str]) -> StrataSpec:
    """'tool_calls', 'search_calls,code_calls', 'random:tool_calls' or 'random_k:3' -> StrataSpec.

    Raises ValueError naming the spec when it is none of these (the CLI flag check calls this).
    """
    if not isinstance(spec, str) or ":" not in spec:
        return StrataSpec(_parse_keys(spec, spec))
    kind, _, rest = spec.partition(":")
    kind = kind.strip()
    if kind == RANDOM_SHUFFLE:
        return StrataSpec(_parse_keys(spec, rest), shuffle=True)
    if kind == RANDOM_K:
        try:
            k = int(rest.strip())
        except ValueError:
            k = 0
        if k < 1:
            raise ValueError(f"stratify_by {spec!r}: random_k:K needs an integer K >= 1 (strata per group)")
        return StrataSpec((), random_k=k)
    raise ValueError(f"stratify_by must be one of {STRATA_SPEC_FORMS}, got {spec!r} (unknown kind {kind!r})")


def parse_stratify_by(spec: str | Sequence[str]) -> tuple[str, ...]:
    """'tool_calls' -> ('tool_calls',); 'search_calls,code_calls' -> a signature key.

    Structural specs only: a random spec raises, so code that builds strata straight from info
    keys cannot silently train on the structural strata of a run that asked for random ones
    (use :func:`batch_strata`, or ``parse_strata_spec(spec).structural_keys`` for display).
    """
    parsed = parse_strata_spec(spec)
    if parsed.is_random:
        raise ValueError(f"stratify_by {spec!r} is a random-strata spec: build its strata with "
                         f"openrlhf_sgrpo.strata.batch_strata and a seeded generator")
    return parsed.keys


def _as_counts(info: Mapping[str, Any], key: str) -> torch.Tensor:
    if key not in info:
        raise KeyError(
            f"Experience.info has no {key!r} to stratify by: the agent must emit it in extra_logs "
            f"(ours is {EMITTING_AGENT}); available keys: {sorted(info)}")
    values = torch.as_tensor(info[key]).reshape(-1)
    if values.is_floating_point():
        if not bool(torch.isfinite(values).all()) or not bool((values == values.round()).all()):
            raise ValueError(f"info[{key!r}] must hold integer counts, got {values.tolist()[:8]}...")
    values = values.to(torch.int64)
    if bool((values < 0).any()):
        raise ValueError(f"info[{key!r}] must hold non-negative counts, got min {int(values.min())}")
    return values


def strata_from_info(info: Mapping[str, Any], key: str | Sequence[str] = DEFAULT_STRATIFY_BY,
                     cap: int | None = None) -> torch.Tensor:
    """Per-sample int64 stratum ids from integer info keys.

    With several keys the capped counts are combined in mixed radix, so every distinct
    (search_calls, code_calls) pair gets its own id. Ids only need to be consistent within one
    batch: strata are compared inside a prompt group, never across batches.
    """
    if cap is not None and (not isinstance(cap, int) or cap < 1):
        raise ValueError(f"strata cap must be a positive int or None, got {cap!r}")
    keys = parse_stratify_by(key)
    ids: torch.Tensor | None = None
    for k in keys:
        counts = _as_counts(info, k)
        if cap is not None:
            counts = counts.clamp_max(cap)
        if ids is None:
            ids = counts
            continue
        if counts.shape != ids.shape:
            raise ValueError(f"info[{k!r}] has {counts.numel()} values, expected {ids.numel()}")
        radix = (cap + 1) if cap is not None else int(counts.max()) + 1
        ids = ids * radix + counts
    assert ids is not None
    return ids


def strata_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator of one step's random strata, from the run seed and the step number."""
    return torch.Generator().manual_seed(((int(seed) * 1_000_003 + int(step)) ^ _STRATA_SEED_SALT) % (2 ** 63))


def shuffle_within_groups(strata: torch.Tensor, n_samples_per_prompt: int, generator: torch.Generator) -> torch.Tensor:
    """The ids permuted inside each contiguous group of ``n_samples_per_prompt``: every group keeps
    the multiset of its ids (so its strata sizes), membership becomes random. One batched argsort
    of uniform keys (no loop over groups); draws come from ``generator`` alone."""
    n = n_samples_per_prompt
    if not isinstance(n, int) or n < 1 or strata.dim() != 1 or strata.numel() % n:
        raise ValueError(f"{tuple(strata.shape)} strata ids do not form groups of n_samples_per_prompt={n!r}")
    keys = torch.rand(strata.numel() // n, n, generator=generator, device=generator.device)
    perm = keys.argsort(dim=1).to(strata.device)
    return strata.view(-1, n).gather(1, perm).reshape(-1)


def random_k_strata(num_samples: int, n_samples_per_prompt: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """K random strata per group: ids 0..K-1 dealt round-robin (sizes differ by at most 1), then
    shuffled inside each group. K >= n gives singletons (SAN is then 0: GN alone)."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"random_k needs an integer K >= 1, got {k!r}")
    n = n_samples_per_prompt
    if not isinstance(n, int) or n < 1 or num_samples % n:
        raise ValueError(f"{num_samples} samples do not form groups of n_samples_per_prompt={n!r}")
    dealt = (torch.arange(n) % k).repeat(num_samples // n)
    return shuffle_within_groups(dealt, n, generator)


def batch_strata(info: Mapping[str, Any], spec: str | Sequence[str], num_samples: int, n_samples_per_prompt: int,
                 cap: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """The estimator's int64 stratum ids for a prompt-contiguous batch, for any ``stratify_by``.

    ``info`` holds the spec's keys for ``num_samples`` samples (random_k reads none).
    Structural specs are :func:`strata_from_info`; random ones need ``generator`` (seeded by the
    caller from the run seed and step, :func:`strata_generator`) and raise without it, so no
    draw ever comes from the global RNG.
    """
    parsed = parse_strata_spec(spec)
    if parsed.is_random and generator is None:
        raise ValueError(f"stratify_by {spec!r} draws random strata and needs a seeded torch.Generator "
                         f"(openrlhf_sgrpo.strata.strata_generator(seed, step)), got None")
    if parsed.random_k is not None:
        return random_k_strata(num_samples, n_samples_per_prompt, parsed.random_k, generator)
    ids = strata_from_info(info, parsed.keys, cap=cap)
    if ids.numel() != num_samples:
        raise ValueError(f"info[{parsed.keys}] gives {ids.numel()} strata ids for {num_samples} samples")
    return shuffle_within_groups(ids, n_samples_per_prompt, generator) if parsed.shuffle else ids
