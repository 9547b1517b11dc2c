"""The warm-up's demonstrations: expert trajectories of training questions, run for real.

Each training question's expert turns (:func:`~openrlhf_sgrpo.demo.synth_task.expert_turns`; in the
trap regime the imperfect expert's, :func:`~openrlhf_sgrpo.demo.trap_task.expert_script`) go
through the agent, the retriever and the tokenizer exactly as a rollout does
(:class:`~openrlhf_sgrpo.local.warmup.ExpertEngine` in the engine's place), so the warm-up fits
the token sequences RL will sample, observations included. Kept: demonstrations that end with
the right answer (the retriever showed every hop's passage). The demo's training retriever holds
the training pairs' passages only, so no held-out name can appear; a demonstration that names one
anyway (another corpus, a changed generator) is dropped and counted, never trained on.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from agent_env import info_keys as K
from agent_env.rewards import exact_match
from openrlhf_sgrpo.demo.synth_task import TaskQuestion
from openrlhf_sgrpo.demo.trap_task import expert_script
from openrlhf_sgrpo.local.experience import Sample


@dataclass(frozen=True)
class Demonstrations:
    samples: list[Sample]
    run: int  # demonstrations run
    wrong: int  # dropped: the EM was not the script's (a passage it reads was not retrieved)
    leaked: int  # dropped: a held-out entity showed up in the text

    def describe(self) -> str:
        hops = sum(s.info.get(K.SEARCH_CALLS, 0) == 2 for s in self.samples)
        paid = sum(s.info.get(K.EM, 0.0) >= 1.0 for s in self.samples)
        return (f"{len(self.samples)} expert trajectories ({hops} with two searches, {paid} answered right) from "
                f"{self.run} run; dropped {self.wrong} whose EM was not the script's, {self.leaked} naming a "
                "held-out entity")


def run_demonstrations(make_rollout: Callable, tokenizer, questions: list[TaskQuestion],
                       prompt_fn: Callable[[str], str], forbidden: list[str]) -> Demonstrations:
    """Run the expert on ``questions``; ``make_rollout(engine)`` builds an AgentRollout around it
    (closed here), ``prompt_fn`` renders a question as the agent does, ``forbidden`` are the
    held-out names no kept trajectory may contain."""
    from openrlhf_sgrpo.demo.task_checks import mentions
    from openrlhf_sgrpo.local.warmup import ExpertEngine

    planned = {prompt_fn(q.question): expert_script(q) for q in questions}
    scripts = {prompt: turns for prompt, (turns, _) in planned.items()}
    if len(scripts) != len(questions):
        raise ValueError("two training questions render the same prompt; their scripts would collide")
    rollout = make_rollout(ExpertEngine(tokenizer, scripts))
    try:
        result = rollout.run([q.question for q in questions], [[q.answer] for q in questions], n=1, greedy=True,
                             desc="expert demonstrations")
    finally:
        rollout.close()
    kept, wrong, leaked = [], 0, 0
    for q, sample in zip(questions, result.samples):
        answer = planned[prompt_fn(q.question)][1]
        text = tokenizer.decode(sample.sequences.tolist(), skip_special_tokens=False)
        read = " ".join(re.findall(r"<information>(.*?)</information>", text, re.S))
        # the script's answer was shown to it (the retriever returned the passage it reads), and
        # it scored what the script meant (EM 1 for the gold, 0 for the trap's wrong answers)
        if not mentions(read, answer) or sample.info.get(K.EM, 0.0) != exact_match(answer, [q.answer]):
            wrong += 1
            continue
        if any(mentions(text, n) for n in forbidden):
            leaked += 1
            continue
        kept.append(sample)
    return Demonstrations(kept, len(questions), wrong, leaked)
