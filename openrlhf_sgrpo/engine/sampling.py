"""A stand-in for vLLM's SamplingParams and RequestOutput, for the local HF engine.

Only the fields OpenRLHF's executors and our agent touch are here; the agent only sets
attributes both classes share (`stop`, `include_stop_str_in_output`, `max_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """vLLM-compatible sampling settings (same names and defaults where they overlap)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: disabled
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.n != 1:
            raise ValueError(f"n={self.n}: the local engine samples one completion per request")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")

    @property
    def stop_strings(self) -> list[str]:
        if not self.stop:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


@dataclass
class Logprob:
    logprob: float


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    logprobs: list[dict[int, Logprob]] | None = None
    stop_reason: str | int | None = None


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True
