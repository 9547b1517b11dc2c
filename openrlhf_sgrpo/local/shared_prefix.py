"""Action log-probs of a prompt group with the shared prompt computed once.

Why: a GRPO step scores ``n_samples`` trajectories of each prompt, and every one of them starts
with the same prompt tokens. On the demo's generated task the prompt (Search-R1's instruction in
SmolLM2's chat template) is ~40 % of a trajectory's tokens, and on a CPU the update's forward and
backward cost is proportional to the tokens run through the model. Running the prompt once per
micro-batch, and the continuations against its cached keys and values expanded to every row,
computes the same log-probs and (autograd sums the rows' gradients through the expansion) the
same gradient, with fewer tokens through the model. ``tests/test_shared_prefix.py`` checks the
log-probs and the gradient against :func:`~openrlhf_sgrpo.local.loss.action_log_probs` to a
float tolerance; the matrices differ in shape, so their rounding does too.

The shared prefix stops before the first action token of any row: every position in it is
prompt, no logit is computed there, and the first action token is scored from the suffix pass
like every later one.
"""

from __future__ import annotations

import torch

from openrlhf_sgrpo.local import upstream
from openrlhf_sgrpo.local.experience import Batch

MIN_SHARED = 8  # below this many shared tokens the second pass costs more than it saves


def shared_prefix_len(batch: Batch) -> int:
    """Tokens every row of ``batch`` holds identically at its start, cut before the first action
    position (the column whose logits score the first action token) of any row."""
    seqs, attn = batch.sequences, batch.attention_mask
    same = ((seqs == seqs[:1]) & (attn == 1)).all(0)
    common = int(same.long().cumprod(0).sum())
    columns = batch.action_mask.any(0).nonzero()
    first_action = int(columns[0]) if columns.numel() else seqs.shape[1]
    return min(common, first_action)


def action_log_probs_shared(model, batch: Batch, temperature: float = 1.0) -> torch.Tensor:
    """[B, L-1] log-probs of ``sequences[:, 1:]`` (0 off the actions), as
    :func:`~openrlhf_sgrpo.local.loss.action_log_probs`, with the rows' shared prefix run once
    (falls back to the plain pass where fewer than :data:`MIN_SHARED` tokens are shared)."""
    from openrlhf_sgrpo.local.loss import action_log_probs

    prefix = shared_prefix_len(batch)
    if batch.sequences.shape[0] < 2 or prefix < MIN_SHARED:
        return action_log_probs(model, batch, temperature)
    from transformers.cache_utils import DynamicCache

    device = next(model.parameters()).device
    seqs, attn = batch.sequences.to(device), batch.attention_mask.to(device)
    rows, width = seqs.shape
    out = torch.zeros(rows, width - 1, dtype=torch.float32, device=device)
    columns = batch.action_mask.any(0).nonzero().squeeze(1).to(device)
    if columns.numel() == 0:
        return out
    cache = DynamicCache(config=model.config)
    head = seqs[:1, :prefix]
    model.get_decoder()(input_ids=head, attention_mask=attn[:1, :prefix],
                        position_ids=torch.arange(prefix, device=device)[None], past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(rows)  # differentiable: every row's gradient flows into the one prefix
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=seqs[:, prefix:], attention_mask=attn, position_ids=positions[:, prefix:],
                   past_key_values=cache, use_cache=True, logits_to_keep=columns - prefix).logits
    kept = upstream.log_probs_from_logits(logits.float(), seqs[:, columns + 1], temperature=temperature)
    return out.index_copy(1, columns, kept) * batch.action_mask.to(device)
