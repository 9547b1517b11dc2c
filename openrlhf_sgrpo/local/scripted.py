"""Scripted first turns: a forced policy/engine boundary that gives every group what a check needs.

A sampled rollout's rewards depend on the CPU's floating point, so no seed makes "this group has
reward spread" or "someone called a tool" portable. When a run must guarantee them (the
``--smoke`` demo, the training tests), :class:`~openrlhf_sgrpo.local.rollout.AgentRollout` takes
a :data:`FirstTurnScript`: for sample slot ``k`` of every prompt group it may return the text of
that trajectory's first turn, which the engine boundary returns instead of sampling; later turns
are sampled as usual. :func:`spread_script` fixes three slots:

* slot 0 answers the gold inside a valid Search-R1 turn: the metric's maximum (1) and, with the
  format reward, a valid sequence, so its reward is the group's maximum;
* slot 1 answers a word that shares no token with any gold: metric 0, so its reward is lower;
* slot 2 searches for the question: one tool call for sure (stratum >= 1).

Slots 0 and 1 differ in reward whatever else is sampled, so every group has spread and slot 0
a strictly positive advantage under every estimator here; the update is never a no-op. The
scripted tokens are trained on like sampled ones (their old log-probs come from the policy's
forward pass, as every sample's do).
"""

from __future__ import annotations

from collections.abc import Callable

from agent_env.rewards import normalize_answer
from openrlhf_sgrpo.engine.sampling import CompletionOutput, RequestOutput

FirstTurnScript = Callable[[int, str, list[str]], "str | None"]  # (slot, question, golds) -> text or None
WRONG_ANSWERS = ("unknown", "nobody", "nothing", "zzz")


def _gold(golds: list[str]) -> str:
    """The first gold that survives answer normalization (an all-punctuation gold scores 0)."""
    return next((g for g in golds if normalize_answer(g)), golds[0] if golds else "")


def _wrong(golds: list[str]) -> str:
    taken = {w for g in golds for w in normalize_answer(g).split()}
    return next(w for w in WRONG_ANSWERS if w not in taken)


def spread_script(slot: int, question: str, golds: list[str]) -> str | None:
    """Slot 0: the gold; slot 1: a wrong answer; slot 2: a search; other slots: sampled."""
    if slot == 0:
        return f"<think> I know this. </think>\n<answer> {_gold(golds)} </answer>"
    if slot == 1:
        return f"<answer> {_wrong(golds)} </answer>"
    if slot == 2:
        return f"<search> {question.strip()} </search>"
    return None


class FirstTurnForced:
    """The engine seen by one trajectory: its first ``generate`` returns ``text``, the rest sample.

    The text is returned whole, whatever ``max_tokens`` says: a script cut at a per-turn cap would
    no longer guarantee what it is for (``max_len`` still bounds the trajectory downstream)."""

    def __init__(self, engine, tokenizer, text: str):
        self.engine, self.tokenizer, self.text = engine, tokenizer, text

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        if self.text is None:
            return await self.engine.generate(prompt_token_ids, sampling_params, multi_modal_data=multi_modal_data)
        if sampling_params.logprobs is not None:
            raise ValueError("a scripted turn has no sampling log-probs; do not request logprobs with a script")
        text, self.text = self.text, None
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        out = CompletionOutput(0, self.tokenizer.decode(ids), ids, "stop")
        return RequestOutput(list(prompt_token_ids), [out])
