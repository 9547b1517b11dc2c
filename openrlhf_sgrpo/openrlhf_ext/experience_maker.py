"""OpenRLHF's experience maker with the stratified estimators plugged in.

``compute_advantages_and_returns`` is OpenRLHF 0.11.2's override point for new estimators.
For ``stratified_*`` we reproduce upstream's reward bookkeeping (fp32 promotion, length
penalties, prompt order through ``experience.index``), swap the group baseline for the
stratified one, then hand the per-sample advantage to OpenRLHF's own token-level path
(``compute_reward`` with the KL term, ``get_cumulative_returns``). Every other estimator is
delegated to upstream untouched.

Tool tokens (retrieved passages, sandbox output) are not the policy's actions, so OpenRLHF's
length penalties must count action tokens only (OpenRLHF #1243): we evaluate them on
``action_mask.sum()`` instead of the first-to-last action span, for every estimator.

``stratified_reinforce`` whitens token advantages over the batch exactly as upstream does for
``reinforce_baseline`` (unless ``--algo.advantage.no_std_norm``), so at alpha=0 it *is* upstream's
estimator, as ``stratified_grpo`` at alpha=0 is ``group_norm``.

Random strata (``--algo.advantage.stratify_by random:tool_calls`` or ``random_k:K``, the paper's
control) are drawn from a generator seeded by the run's seed and the step number
(:func:`openrlhf_sgrpo.strata.strata_generator`), the step counted from the checkpoint a resumed
run loads, never from the global RNG. Every estimator (upstream ones too) logs the mechanism,
the advantage mass per tool-call stratum (:mod:`openrlhf_sgrpo.mechanism`), beside the monitors.

OpenRLHF's actor logs every ``Experience.info`` tensor (one all-reduce each per micro-batch).
The agent's per-turn slots (token ranges, doc ids) are inputs of CalibAdv, not metrics, so
they are dropped once the advantages are final; the counters and ``sgrpo/*`` monitors stay.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from openrlhf.models.utils import compute_reward
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

from agent_env import info_keys as K
from openrlhf_sgrpo.advantages import compute_stratified
from openrlhf_sgrpo.mechanism import estimator_mechanism
from openrlhf_sgrpo.metrics import stratification_metrics
from openrlhf_sgrpo.openrlhf_ext.batch_order import ADVANTAGE_INFO_KEY, batch_order, prompt_ordered
from openrlhf_sgrpo.openrlhf_ext.calibadv_hook import apply_calibadv
from openrlhf_sgrpo.openrlhf_ext.config import sgrpo_options
from openrlhf_sgrpo.openrlhf_ext.rollout_dump import RolloutDump, resumed_global_step
from openrlhf_sgrpo.strata import batch_strata, parse_strata_spec, strata_from_info, strata_generator

# Upstream estimators with a group baseline, as (our estimator at alpha 0, eps, std) giving the
# same sequence-level advantage (tests/test_openrlhf_wiring.py's peer checks): their mechanism
# is all group term. dr_grpo is R - mean like reinforce_baseline before its batch whitening.
UPSTREAM_GROUP_TERMS: dict[str, tuple[str, float | None, str | None]] = {
    "group_norm": ("stratified_grpo", 1e-9, "unbiased"),
    "reinforce_baseline": ("stratified_reinforce", None, None),
    "dr_grpo": ("stratified_reinforce", None, None),
    "rloo": ("stratified_rloo", None, None),
}


@contextmanager
def action_token_lengths(experiences: list) -> Iterator[None]:
    """Temporarily make ``response_length`` the number of action tokens (OpenRLHF #1243)."""
    saved = [e.response_length for e in experiences]
    try:
        for e in experiences:
            if e.response_length is not None and e.action_mask is not None:
                e.response_length = e.action_mask.sum(-1).to(e.response_length.dtype)
        yield
    finally:
        for e, length in zip(experiences, saved):
            e.response_length = length


class StratifiedExperienceMaker(RemoteExperienceMaker):
    """RemoteExperienceMaker + stratified_grpo / stratified_reinforce / stratified_rloo."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rollout_dump = RolloutDump(self.args, self.tokenizer)  # --sgrpo.dump_rollouts
        self.step = resumed_global_step(self.args) or 0  # numbers the random strata draws

    def strata_generator(self) -> torch.Generator:
        """This step's generator for random strata: the run seed and the step (not global RNG)."""
        return strata_generator(run_seed(self.args), self.step)

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences: list) -> list:
        opts = sgrpo_options(self.args)
        self.step += 1
        generator = self.strata_generator() if parse_strata_spec(opts.stratify_by).is_random else None
        with action_token_lengths(experiences):
            if not opts.is_stratified:
                experiences = super().compute_advantages_and_returns(experiences)
                # Theorem monitors for every estimator, on the same strata key (when emitted).
                attach_batch_metrics(experiences, group_monitors(experiences, self.args, opts, generator))
            else:
                experiences = self._stratified_advantages_and_returns(experiences, opts, generator)
        apply_calibadv(experiences, self.args)  # no-op unless --algo.calibadv.enable
        self.rollout_dump(experiences, opts, ADVANTAGE_INFO_KEY if opts.is_stratified else None)
        drop_turn_slots(experiences)
        return experiences

    def _stratified_advantages_and_returns(self, experiences: list, opts, generator=None) -> list:
        args = self.args
        n = args.rollout.n_samples_per_prompt
        for e in experiences:
            e.rewards = e.rewards.to(torch.promote_types(e.rewards.dtype, torch.float32))
        apply_length_penalties(experiences, args)

        rewards, strata = ordered_rewards_and_strata(experiences, opts, n, generator)
        advantages = compute_stratified(opts.estimator, rewards, strata, n, opts.alpha, opts.eps, opts.std)

        batch_metrics = stratification_metrics(rewards, strata, n, advantages, eps=opts.eps)
        tool_calls = ordered_tool_calls(experiences)
        if tool_calls is not None:  # the advantage mass per tool-call stratum (mechanism.py)
            batch_metrics.update(estimator_mechanism(opts.estimator, rewards, strata, tool_calls, n, opts.alpha,
                                                     opts.eps, opts.std))
        group_std = rewards.reshape(-1, n).std(-1, keepdim=True).expand(-1, n).reshape(-1)
        for e, adv, std in zip(experiences, batch_order(experiences, advantages), batch_order(experiences, group_std)):
            e.info["group_reward_std"] = std
            e.info[ADVANTAGE_INFO_KEY] = adv
            self._token_level_returns(e, adv)
        if opts.estimator == "stratified_reinforce":
            whiten_like_reinforce_baseline(experiences, scale=not args.algo.advantage.no_std_norm)
        attach_batch_metrics(experiences, batch_metrics)
        return experiences

    def _token_level_returns(self, experience, advantage: torch.Tensor) -> None:
        """OpenRLHF's own REINFORCE-family token path, fed the stratified advantage."""
        args = self.args
        reward = compute_reward(
            advantage, self.kl_ctl.value, experience.kl,
            action_mask=experience.action_mask, reward_clip_range=args.reward.clip_range,
        )
        experience.returns = self.get_cumulative_returns(reward, experience.action_mask, 1.0)
        experience.advantages = experience.returns.clone()
        experience.info["return"] = reward.sum(dim=-1)
        experience.kl = None


def whiten_like_reinforce_baseline(experiences: list, scale: bool = True) -> None:
    """Upstream's batch normalization for ``reinforce_baseline``: minus the masked mean over every
    action token of the batch, divided by the masked std (clamped at 1e-8) unless ``no_std_norm``
    (``RemoteExperienceMaker.compute_advantages_and_returns``, 0.11.2)."""
    advantages = torch.cat([e.advantages.flatten() for e in experiences]).float()
    masks = torch.cat([e.action_mask.flatten() for e in experiences])
    num_actions = masks.sum()
    mean = (advantages * masks).sum() / num_actions
    rstd = (((advantages - mean).pow(2) * masks).sum() / num_actions).clamp(min=1e-8).rsqrt() if scale else 1
    for e in experiences:
        e.advantages = (e.advantages - mean) * rstd


def drop_turn_slots(experiences: list) -> None:
    """Remove the agent's per-turn slots from ``info``: consumed by now, and noise as metrics.

    Each distinct key is matched once per batch, not once per experience: with the monitors and
    the mechanism's 25 keys riding in every experience's info, a per-experience match was most
    of this function's cost (bench/advantage_speed.py)."""
    keys: set[str] = set()
    for e in experiences:
        keys.update(e.info)
    slots = [k for k in keys if K.is_turn_slot_key(k)]
    if not slots:
        return
    for e in experiences:
        for key in slots:
            e.info.pop(key, None)


def attach_batch_metrics(experiences: list, metrics: dict[str, float]) -> None:
    """Batch-level monitors ride along as per-sample constants: OpenRLHF's actor logs the
    sample-weighted mean of every info tensor, which is then the batch value itself."""
    # Experiences of one size share read-only tensors: thousands of tiny allocations per step
    # were the bulk of this override's overhead over upstream (bench/advantage_speed.py).
    by_size: dict[int, dict[str, torch.Tensor]] = {}
    for e in experiences:
        size = len(e.index)
        if size not in by_size:
            by_size[size] = {name: torch.full((size,), float(value)) for name, value in metrics.items()}
        e.info.update(by_size[size])


def group_monitors(experiences: list, args, opts, generator: torch.Generator | None = None) -> dict[str, float]:
    """Theorem monitors and the mechanism for a non-stratified estimator; {} when the strata key
    is not emitted.

    The mechanism of an upstream estimator with a group baseline (:data:`UPSTREAM_GROUP_TERMS`)
    is its sequence-level advantage, all group term, recomputed from the same rewards (upstream
    does not keep it apart from the KL term); others (reinforce, gae) log none.
    """
    keys = parse_strata_spec(opts.stratify_by).keys
    if any(k not in e.info for e in experiences for k in keys):
        return {}
    n = args.rollout.n_samples_per_prompt
    if n < 2:  # no prompt groups, nothing to decompose
        return {}
    rewards, strata = ordered_rewards_and_strata(experiences, opts, n, generator)
    out = stratification_metrics(rewards, strata, n, eps=opts.eps)
    tool_calls = ordered_tool_calls(experiences)
    twin = UPSTREAM_GROUP_TERMS.get(opts.estimator)
    if twin is not None and tool_calls is not None:
        estimator, eps, std = twin
        out.update(estimator_mechanism(estimator, rewards.float(), strata, tool_calls, n, 0.0,
                                       opts.eps if eps is None else eps, std or opts.std))
    return out


def ordered_tool_calls(experiences: list) -> torch.Tensor | None:
    """The batch's tool-call counts in prompt order (the mechanism's strata); None when the agent
    does not emit them (a plain, non-agent run)."""
    if any(K.TOOL_CALLS not in e.info for e in experiences):
        return None
    return prompt_ordered(experiences, [_info_values(e, K.TOOL_CALLS) for e in experiences])


def ordered_rewards_and_strata(experiences: list, opts, n_samples_per_prompt: int,
                               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards and stratum ids of the whole batch, in prompt order.

    Strata are built from the merged batch (not per experience) so that signature keys use one
    mixed radix for every sample; random strata (a random ``stratify_by``) are drawn from
    ``generator``.
    """
    keys = parse_strata_spec(opts.stratify_by).keys
    rewards = prompt_ordered(experiences, [e.rewards for e in experiences])
    merged_info = {k: prompt_ordered(experiences, [_info_values(e, k) for e in experiences]) for k in keys}
    return rewards, batch_strata(merged_info, opts.stratify_by, rewards.numel(), n_samples_per_prompt,
                                 opts.strata_cap, generator)


def run_seed(args) -> int:
    """OpenRLHF's ``--train.seed`` (42 when absent, upstream's default)."""
    return int(getattr(getattr(args, "train", None), "seed", 42))


def _info_values(experience, key: str) -> torch.Tensor:
    """One info key of one (possibly batched) experience, with a message naming the agent."""
    if key not in experience.info:
        strata_from_info(experience.info, key)  # raises the KeyError that names the agent
    return torch.as_tensor(experience.info[key]).reshape(-1)
