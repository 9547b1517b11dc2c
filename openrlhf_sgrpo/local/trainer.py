"""The single-machine Stratified GRPO loop (CPU or one GPU), top to bottom.

One step:
  1. rollout   — ``n_samples`` trajectories for each of ``prompts_per_step`` questions through
                 OpenRLHF's agent executor and the HF engine (:mod:`.rollout`);
  2. advantage — strata from the agent's info, the stratified estimator, the paper monitors,
                 OpenRLHF's token-level returns (:mod:`.advantage`), CalibAdv if enabled;
  3. update    — micro-batches through OpenRLHF's ``PolicyLoss`` (+ SAPO, + KL to a frozen
                 reference if ``kl_coef > 0``), gradients accumulated over the whole batch
                 (token-mean over all its action tokens), one AdamW step;
  4. log + checkpoint.
With one optimizer step per rollout batch the policy that sampled is the policy being
updated, so ``old_log_probs`` are the current log-probs detached (OpenRLHF computes the same
numbers with an extra forward). Ctrl-C during a step leaves the last completed step's
checkpoint (weights only change at ``optimizer.step``), so ``resume`` continues from there.
"""

from __future__ import annotations

import copy
import logging
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from agent_env import info_keys as K
from openrlhf_sgrpo.local.advantage import AdvantageConfig, apply_calibadv, sample_advantages, token_advantages
from openrlhf_sgrpo.local.data import Question
from openrlhf_sgrpo.local.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from openrlhf_sgrpo.local.experience import Sample, collate
from openrlhf_sgrpo.local.loss import LossConfig, PolicyObjective, action_log_probs
from openrlhf_sgrpo.local.metrics_log import MetricsLogger
from openrlhf_sgrpo.local.rollout import AgentRollout
from openrlhf_sgrpo.local.timing import Stopwatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 4
    prompts_per_step: int = 2
    n_samples: int = 4
    micro_batch_size: int = 4
    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    save_every: int = 1
    keep_checkpoints: int = 2
    adv: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "micro_batch_size", "save_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.n_samples < 2:
            raise ValueError(f"n_samples must be >= 2 for a group baseline, got {self.n_samples!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")


class PromptStream:
    """Questions in a seeded shuffled order, epoch after epoch; the cursor is checkpointed."""

    def __init__(self, questions: list[Question], seed: int, cursor: int = 0):
        if not questions:
            raise ValueError("no training questions")
        self.questions, self.seed, self.cursor = questions, seed, cursor

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.questions)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[Question]:
        out = []
        for _ in range(k):
            epoch, pos = divmod(self.cursor, len(self.questions))
            out.append(self.questions[self._order(epoch)[pos]])
            self.cursor += 1
        return out


def _mean_info(samples: list[Sample], key: str) -> float:
    values = [s.info.get(key, 0.0) for s in samples]
    return sum(values) / max(1, len(values))


class LocalTrainer:
    """Stratified GRPO on one machine; ``train()`` runs (or resumes) up to ``cfg.steps`` steps."""

    def __init__(self, model, tokenizer, rollout: AgentRollout, questions: list[Question], cfg: TrainConfig,
                 out_dir: str | Path, logger: MetricsLogger | None = None):
        self.model, self.tokenizer, self.rollout, self.cfg = model, tokenizer, rollout, cfg
        self.out_dir = Path(out_dir)
        self.ckpt_dir = self.out_dir / "checkpoints"
        self.logger = logger or MetricsLogger(self.out_dir, config=_config_dict(cfg))
        self.objective = PolicyObjective(cfg.loss)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.ref_model = self._reference(model) if cfg.loss.kl_coef > 0 else None
        self.stream = PromptStream(questions, cfg.seed)
        self.step = 0
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @staticmethod
    def _reference(model):
        ref = copy.deepcopy(model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    # ------------------------------------------------------------ state
    def resume(self) -> bool:
        """Load the newest checkpoint under ``out_dir/checkpoints``; False when there is none."""
        path = latest_checkpoint(self.ckpt_dir)
        if path is None:
            return False
        state = load_checkpoint(path, self.model, self.optimizer)
        self.step, self.stream.cursor = int(state["step"]), int(state["cursor"])
        if self.ref_model is not None and (path / "reference.pt").exists():
            self.ref_model.load_state_dict(torch.load(path / "reference.pt", weights_only=True))
        log.info("resumed from %s at step %d", path, self.step)
        return True

    def save(self) -> Path:
        path = save_checkpoint(self.ckpt_dir, self.step, self.model, self.optimizer,
                               {"cursor": self.stream.cursor, "config": _config_dict(self.cfg)},
                               keep=self.cfg.keep_checkpoints)
        if self.ref_model is not None:
            torch.save(self.ref_model.state_dict(), path / "reference.pt")
        return path

    # ------------------------------------------------------------ loop
    def train(self, progress: bool = True) -> list[dict]:
        """Run steps ``self.step+1 .. cfg.steps``; returns their metric records."""
        records = []
        bar = tqdm(total=self.cfg.steps, initial=self.step, desc="train", unit="step", disable=not progress,
                   dynamic_ncols=True)
        try:
            while self.step < self.cfg.steps:
                record = self.train_step()
                records.append(record)
                bar.update(1)
                bar.set_postfix(reward=f"{record['reward']:.3f}", em=f"{record['em']:.2f}",
                                tools=f"{record['tool_calls']:.2f}",
                                strata=f"{record.get('sgrpo/strata_per_prompt', float('nan')):.2f}")
                if self.step % self.cfg.save_every == 0 or self.step == self.cfg.steps:
                    self.save()
        except KeyboardInterrupt:
            self.optimizer.zero_grad(set_to_none=True)  # a half-accumulated step is dropped
            path = self.save()
            bar.write(f"interrupted: checkpoint of step {self.step} saved in {path}; rerun with --resume")
            raise
        finally:
            bar.close()
        return records

    def train_step(self) -> dict:
        cfg = self.cfg
        questions = self.stream.take(cfg.prompts_per_step)
        step = self.step + 1
        result = self.rollout.run([q.question for q in questions], [q.golds for q in questions], n=cfg.n_samples,
                                  desc=f"rollout {step}")
        samples = result.samples
        with Stopwatch() as adv_time:
            adv = sample_advantages(samples, cfg.n_samples, cfg.adv)
        with Stopwatch() as bwd_time:
            update = self._update(samples, adv.advantages)
        self.step = step
        record = {
            "reward": float(adv.rewards.mean()), "reward_std": float(adv.rewards.std()) if len(samples) > 1 else 0.0,
            "em": _mean_info(samples, K.EM), "f1": _mean_info(samples, K.F1),
            "tool_calls": _mean_info(samples, K.TOOL_CALLS), "search_calls": _mean_info(samples, K.SEARCH_CALLS),
            "answered": _mean_info(samples, K.ANSWERED), "action_tokens": _mean_info(samples, K.ACTION_TOKENS),
            "total_length": sum(s.total_length for s in samples) / len(samples),
            "strata_hist": _histogram(adv.strata.tolist()),
            **adv.metrics, **update, **result.timing,
            "time/advantage_s": adv_time.seconds, "time/update_s": bwd_time.seconds,
        }
        return self.logger.log(step, record)

    def _update(self, samples: list[Sample], advantages: torch.Tensor) -> dict:
        """Accumulate gradients over micro-batches (global token-mean), then one AdamW step."""
        cfg = self.cfg
        total_tokens = float(sum(int(s.action_mask.sum()) for s in samples))
        if total_tokens == 0:
            return {"skipped_update": 1.0}
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        calib_stats: dict = {}
        for lo in range(0, len(samples), cfg.micro_batch_size):
            part = samples[lo: lo + cfg.micro_batch_size]
            batch = collate(part, self.pad_id)
            mask = batch.action_mask
            token_adv = token_advantages(advantages[lo: lo + len(part)], mask)
            if cfg.adv.calibadv is not None:
                token_adv, calib_stats = apply_calibadv(token_adv, mask, part, advantages[lo: lo + len(part)],
                                                        cfg.n_samples, cfg.adv.calibadv)
            logp = action_log_probs(self.model, batch)
            ref = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref = action_log_probs(self.ref_model, batch)
            loss, stats = self.objective(logp, logp.detach(), token_adv.to(logp.device), mask.to(logp.device),
                                         batch_num_tokens=total_tokens, ref_log_probs=ref)
            loss.backward()
            weight = float(mask.sum()) / total_tokens
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v * (1.0 if k in ("policy_loss", "kl") else weight)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        return {**sums, **calib_stats, "grad_norm": float(grad_norm), "lr": cfg.lr}


def _histogram(values: list[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def _config_dict(cfg: TrainConfig) -> dict:
    return asdict(cfg)
