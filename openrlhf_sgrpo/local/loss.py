"""The policy objective on one micro-batch: OpenRLHF's ``PolicyLoss`` (+ SAPO, + KL to a reference).

Log-probs come from upstream ``log_probs_from_logits``; the surrogate and its token-mean
aggregation from upstream ``PolicyLoss``/``aggregate_loss`` (see :mod:`.upstream`); the SAPO
term from :mod:`openrlhf_sgrpo.sapo`, aggregated with the same reducer, as the OpenRLHF actor
patch (``openrlhf_ext.sapo_actor.SAPOPolicyLoss``) does; the KL loss from upstream
``compute_approx_kl``. With gradient accumulation every micro-batch divides by the *global*
action-token count of its optimizer step (``loss_batch_info``, from OpenRLHF's
``iter_grad_accum_global_norm``), so the accumulated gradient is one token mean over the step.
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
    """[B, L-1] log-prob of sequences[:, 1:] under ``model`` (column i ↔ token i+1); 0 off the actions.

    Logits are computed only at the columns where some row has an action token (HF's
    ``logits_to_keep`` with an index tensor): the prompt and the tool outputs, most of a
    search-agent sequence, never get a ``[L, vocab]`` logit matrix, which on a 49k-150k
    vocabulary is the largest tensor of the update. Upstream ``log_probs_from_logits`` then
    scores the kept columns exactly as OpenRLHF's actor scores all of them.
    """
    seqs, attn = batch.sequences, batch.attention_mask
    device = next(model.parameters()).device
    seqs, attn = seqs.to(device), attn.to(device)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    columns = batch.action_mask.any(0).nonzero().squeeze(1).to(device)
    out = torch.zeros(seqs.shape[0], seqs.shape[1] - 1, dtype=torch.float32, device=device)
    if columns.numel() == 0:
        return out
    logits = model(input_ids=seqs, attention_mask=attn, position_ids=positions, logits_to_keep=columns).logits
    kept = upstream.log_probs_from_logits(logits.float(), seqs[:, columns + 1], temperature=temperature)
    return out.index_copy(1, columns, kept) * batch.action_mask.to(device)


class PolicyObjective:
    """Upstream PolicyLoss + optional SAPO + optional KL-to-reference, returning (loss, stats)."""

    def __init__(self, cfg: LossConfig):
        self.cfg = cfg
        self.policy_loss = upstream.policy_loss_cls()(
            clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high, token_level_loss=True,
            policy_loss_type=cfg.policy_loss_type)

    def __call__(self, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                 action_mask: torch.Tensor, loss_batch_info: dict,
                 ref_log_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """``loss_batch_info`` is OpenRLHF's ``{dp_size, batch_num_tokens, global_batch_size}``
        (from ``iter_grad_accum_global_norm``), passed to every reducer as the actor does."""
        mask = action_mask.to(log_probs.dtype)
        loss, clip_ratio, ppo_kl, _, _ = self.policy_loss(
            log_probs, old_log_probs, advantages, action_mask=mask, **loss_batch_info)
        stats = {"policy_loss": float(loss.detach()), "clip_ratio": float(clip_ratio), "ppo_kl": float(ppo_kl)}
        if self.cfg.sapo is not None:
            term, sapo = sapo_loss(log_probs, old_log_probs, advantages, mask, self.cfg.sapo, aggregate=lambda t, m: (
                upstream.aggregate_loss(t, m, token_level_loss=True, **loss_batch_info)))
            stats.update({k: float(v) for k, v in sapo.as_dict().items()})
            loss = loss + term
        if self.cfg.kl_coef > 0:
            if ref_log_probs is None:
                raise ValueError("kl_coef > 0 needs ref_log_probs (a reference model)")
            kl = upstream.compute_approx_kl(log_probs, ref_log_probs, kl_estimator=self.cfg.kl_estimator)
            kl_loss = upstream.aggregate_loss(kl, mask, token_level_loss=True, **loss_batch_info)
            stats["kl"] = float(kl_loss.detach())
            loss = loss + self.cfg.kl_coef * kl_loss
        return loss, stats
