"""The policy objective on one micro-batch: OpenRLHF's ``PolicyLoss`` (+ SAPO, + KL to a reference).

Log-probs come from upstream ``log_probs_from_logits``; the surrogate and its token-mean
aggregation from upstream ``PolicyLoss``/``aggregate_loss`` (see :mod:`.upstream`); the SAPO
term from :mod:`openrlhf_sgrpo.sapo`, aggregated with the same reducer, as the OpenRLHF actor
patch (``openrlhf_ext.sapo_actor.SAPOPolicyLoss``) does; the KL loss from upstream
``compute_approx_kl``. With gradient accumulation every micro-batch divides by the *global*
action-token count (``batch_num_tokens``), so the summed gradient equals one big batch's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openrlhf_sgrpo.local import upstream
from openrlhf_sgrpo.local.experience import Batch
from openrlhf_sgrpo.sapo import SAPOConfig, sapo_loss


@dataclass(frozen=True)
class LossConfig:
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    policy_loss_type: str = "ppo"
    kl_coef: float = 0.0  # KL(pi || ref) as a loss term; 0 = no reference model
    kl_estimator: str = "k3"
    sapo: SAPOConfig | None = None


def action_log_probs(model, batch: Batch, temperature: float = 1.0) -> torch.Tensor:
    """[B, L-1] log-prob of sequences[:, 1:] under ``model`` (column i ↔ token i+1)."""
    seqs, attn = batch.sequences, batch.attention_mask
    device = next(model.parameters()).device
    seqs, attn = seqs.to(device), attn.to(device)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=seqs, attention_mask=attn, position_ids=positions).logits[:, :-1].float()
    return upstream.log_probs_from_logits(logits, seqs[:, 1:], temperature=temperature)


class PolicyObjective:
    """Upstream PolicyLoss + optional SAPO + optional KL-to-reference, returning (loss, stats)."""

    def __init__(self, cfg: LossConfig):
        self.cfg = cfg
        self.policy_loss = upstream.policy_loss_cls()(
            clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high, token_level_loss=True,
            policy_loss_type=cfg.policy_loss_type)

    def __call__(self, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                 action_mask: torch.Tensor, batch_num_tokens: float,
                 ref_log_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        mask = action_mask.to(log_probs.dtype)
        loss, clip_ratio, ppo_kl, _, _ = self.policy_loss(
            log_probs, old_log_probs, advantages, action_mask=mask, batch_num_tokens=batch_num_tokens)
        stats = {"policy_loss": float(loss.detach()), "clip_ratio": float(clip_ratio), "ppo_kl": float(ppo_kl)}
        if self.cfg.sapo is not None:
            term, sapo = sapo_loss(log_probs, old_log_probs, advantages, mask, self.cfg.sapo, aggregate=lambda t, m: (
                upstream.aggregate_loss(t, m, token_level_loss=True, batch_num_tokens=batch_num_tokens)))
            stats.update({k: float(v) for k, v in sapo.as_dict().items()})
            loss = loss + term
        if self.cfg.kl_coef > 0:
            if ref_log_probs is None:
                raise ValueError("kl_coef > 0 needs ref_log_probs (a reference model)")
            kl = upstream.compute_approx_kl(log_probs, ref_log_probs, kl_estimator=self.cfg.kl_estimator)
            kl_loss = upstream.aggregate_loss(kl, mask, token_level_loss=True, batch_num_tokens=batch_num_tokens)
            stats["kl"] = float(kl_loss.detach())
            loss = loss + self.cfg.kl_coef * kl_loss
        return loss, stats
