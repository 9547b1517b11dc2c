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
from openrlhf_sgrpo.metrics import stratification_metrics
from openrlhf_sgrpo.openrlhf_ext.batch_order import ADVANTAGE_INFO_KEY, batch_order, prompt_ordered
from openrlhf_sgrpo.openrlhf_ext.calibadv_hook import apply_calibadv
from openrlhf_sgrpo.openrlhf_ext.config import sgrpo_options
from openrlhf_sgrpo.openrlhf_ext.rollout_dump import RolloutDump
from openrlhf_sgrpo.strata import parse_stratify_by, strata_from_info


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

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences: list) -> list:
        opts = sgrpo_options(self.args)
        with action_token_lengths(experiences):
            if not opts.is_stratified:
                experiences = super().compute_advantages_and_returns(experiences)
                # Theorem monitors for every estimator, on the same strata key (when emitted).
                attach_batch_metrics(experiences, group_monitors(experiences, self.args, opts))
            else:
                experiences = self._stratified_advantages_and_returns(experiences, opts)
        apply_calibadv(experiences, self.args)  # no-op unless --algo.calibadv.enable
        self.rollout_dump(experiences, opts, ADVANTAGE_INFO_KEY if opts.is_stratified else None)
        drop_turn_slots(experiences)
        return experiences

    def _stratified_advantages_and_returns(self, experiences: list, opts) -> list:
        args = self.args
        n = args.rollout.n_samples_per_prompt
        for e in experiences:
            e.rewards = e.rewards.to(torch.promote_types(e.rewards.dtype, torch.float32))
        apply_length_penalties(experiences, args)

        rewards, strata = ordered_rewards_and_strata(experiences, opts)
        advantages = compute_stratified(opts.estimator, rewards, strata, n, opts.alpha, opts.eps, opts.std)

        batch_metrics = stratification_metrics(rewards, strata, n, advantages, eps=opts.eps)
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
    """Remove the agent's per-turn slots from ``info``: consumed by now, and noise as metrics."""
    for e in experiences:
        for key in [k for k in e.info if K.is_turn_slot_key(k)]:
            del e.info[key]


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


def group_monitors(experiences: list, args, opts) -> dict[str, float]:
    """Theorem monitors for a non-stratified estimator; {} when the strata key is not emitted."""
    keys = parse_stratify_by(opts.stratify_by)
    if any(k not in e.info for e in experiences for k in keys):
        return {}
    n = args.rollout.n_samples_per_prompt
    if n < 2:  # no prompt groups, nothing to decompose
        return {}
    rewards, strata = ordered_rewards_and_strata(experiences, opts)
    return stratification_metrics(rewards, strata, n, eps=opts.eps)


def ordered_rewards_and_strata(experiences: list, opts) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards and stratum ids of the whole batch, in prompt order.

    Strata are built from the merged batch (not per experience) so that signature keys use one
    mixed radix for every sample.
    """
    keys = parse_stratify_by(opts.stratify_by)
    rewards = prompt_ordered(experiences, [e.rewards for e in experiences])
    merged_info = {k: prompt_ordered(experiences, [_info_values(e, k) for e in experiences]) for k in keys}
    return rewards, strata_from_info(merged_info, keys, cap=opts.strata_cap)


def _info_values(experience, key: str) -> torch.Tensor:
    """One info key of one (possibly batched) experience, with a message naming the agent."""
    if key not in experience.info:
        strata_from_info(experience.info, key)  # raises the KeyError that names the agent
    return torch.as_tensor(experience.info[key]).reshape(-1)
