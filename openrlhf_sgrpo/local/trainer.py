"""The single-machine Stratified GRPO loop (CPU or one GPU), top to bottom.

One step mirrors OpenRLHF's (``make_experience``, then ``ActorPPOTrainer.ppo_train``):
  1. rollout     — ``n_samples`` trajectories for each of ``prompts_per_step`` questions through
                   OpenRLHF's agent executor and the engine (vLLM, or the HF fallback;
                   :mod:`.rollout`, :mod:`openrlhf_sgrpo.engine`);
  2. experience  — strata, the stratified estimator, the paper monitors, token-level returns,
                   CalibAdv over whole prompt groups, and the sampling policy's log-probs (plus the
                   reference's), all once, before any update (:mod:`.experience_maker`);
  3. update      — ``max_epochs`` passes; each pass shuffles the prompt groups and cuts
                   mini-batches of ``train_batch_size`` samples, one AdamW step each, gradients
                   accumulated over micro-batches with the mini-batch's global token mean
                   (OpenRLHF's own ``iter_grad_accum_global_norm``; the loss is scaled by
                   ``1 / gas`` as DeepSpeed's backward does). Loss: OpenRLHF's ``PolicyLoss``
                   (+ SAPO, + KL to a frozen reference if ``kl_coef > 0``). From the second
                   optimizer step on, the ratio to the old policy departs from 1, so clipping
                   and SAPO can act;
  4. weight sync — the engine gets the updated weights before the next rollout, as OpenRLHF's
                   ``broadcast_to_vllm`` after each training step (vLLM: a shared-memory file,
                   :mod:`openrlhf_sgrpo.engine.weight_sync`; the HF engine uses the model itself);
  5. log + checkpoint, and with ``record_groups`` the step's first prompt groups as rollout
     records for ``python -m openrlhf_sgrpo.inspect``. ``train_step`` returns a :class:`StepResult` holding every per-sample
     quantity of the step in one place.
Unlike OpenRLHF's replay buffer, which shuffles single samples, the shuffle here moves whole
prompt groups (a mini-batch that is a multiple of ``n_samples`` holds complete groups, as in
verl's mini-batches). Ctrl-C between steps, or before a step's first optimizer step, saves the
last completed step; Ctrl-C after it keeps the last checkpoint (the weights are then between
two steps), so ``resume`` always continues from a completed step. A driver killed outright
(SIGKILL, a lost machine) resumes the same way: ``resume`` first drops the metrics lines and
rollout records of steps after the checkpoint, which it then redoes under the same numbers
(:mod:`.run_files`), so neither file holds a step twice or a line cut short.
"""

from __future__ import annotations

import copy
import logging
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from openrlhf.utils.loss_utils import iter_grad_accum_global_norm
from tqdm.auto import tqdm

from agent_env import info_keys as K
from openrlhf_sgrpo.local.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from openrlhf_sgrpo.local.data import Question
from openrlhf_sgrpo.local.experience import Batch, collate
from openrlhf_sgrpo.local.experience_maker import AdvantageConfig, Experience, make_experience
from openrlhf_sgrpo.local.loss import LossConfig, PolicyObjective, action_log_probs
from openrlhf_sgrpo.local.rollout import AgentRollout
from openrlhf_sgrpo.local.run_files import forget_steps_after
from openrlhf_sgrpo.local.shared_prefix import action_log_probs_shared
from openrlhf_sgrpo.local.step_log import StepLogger
from openrlhf_sgrpo.local.timing import Stopwatch
from openrlhf_sgrpo.rollout_records.sources import records_from_samples
from openrlhf_sgrpo.rollout_records.store import RolloutWriter
from openrlhf_sgrpo.sapo import penalized_mask
from openrlhf_sgrpo.strata import strata_generator

log = logging.getLogger(__name__)

# Stats whose micro-batch values are already normalized by the optimizer step's tokens (the
# loss terms): they add up over the window (after DeepSpeed's 1/gas); the rest are token means.
LOSS_TERMS = ("policy_loss", "kl", "sapo/term")
# What the objective reports for a row with a zero advantage whose log-probs equal the old ones;
# skipping is exact only without KL and SAPO (TrainConfig.skips_exactly), so these are all it has.
SKIPPED_ROW_STATS = ("policy_loss", "clip_ratio", "ppo_kl", "log_ratio_max")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 4
    prompts_per_step: int = 2
    n_samples: int = 4
    micro_batch_size: int = 4
    train_batch_size: int | None = None  # samples per optimizer step (--train.batch_size); None: the rollout
    max_epochs: int = 1  # passes over each rollout (--train.max_epochs)
    gradient_checkpointing: bool = False  # recompute layer activations in backward (--actor.gradient_checkpointing)
    shared_prefix: bool = False  # micro-batches of one prompt's samples, its prompt run once (local/shared_prefix.py)
    skip_zero_advantage: bool = False  # no forward/backward for samples whose gradient is exactly 0 (skips_exactly)
    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    save_every: int = 1
    keep_checkpoints: int = 2
    record_groups: int = 0  # prompt groups per step written as rollout records (RUN_DIR/rollouts/train); 0: none
    adv: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "micro_batch_size", "save_every", "max_epochs"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if int(self.record_groups) < 0:
            raise ValueError(f"record_groups must be >= 0, got {self.record_groups!r}")
        if self.n_samples < 2:
            raise ValueError(f"n_samples must be >= 2 for a group baseline, got {self.n_samples!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        rollout, mini = self.rollout_batch_size, self.mini_batch_size
        if mini < 1 or rollout % mini:
            raise ValueError(f"train_batch_size must divide the rollout batch (prompts_per_step * n_samples = "
                             f"{rollout}), got {self.train_batch_size!r}")
        if mini % self.micro_batch_size:
            raise ValueError(f"micro_batch_size ({self.micro_batch_size}) must divide the train batch size ({mini})")
        if self.shared_prefix and self.n_samples % self.micro_batch_size:
            raise ValueError(f"shared_prefix runs a prompt once per micro-batch of its own samples: micro_batch_size "
                             f"({self.micro_batch_size}) must divide n_samples ({self.n_samples})")
        if self.shared_prefix and self.gradient_checkpointing:
            raise ValueError("shared_prefix needs the prompt's keys and values kept for the backward; gradient "
                             "checkpointing recomputes them without a cache: turn one of them off")

    @property
    def rollout_batch_size(self) -> int:
        return self.prompts_per_step * self.n_samples

    @property
    def mini_batch_size(self) -> int:
        """Samples per optimizer step."""
        return self.train_batch_size if self.train_batch_size is not None else self.rollout_batch_size

    @property
    def optimizer_steps_per_rollout(self) -> int:
        return self.max_epochs * self.rollout_batch_size // self.mini_batch_size

    @property
    def skips_exactly(self) -> bool:
        """Whether ``skip_zero_advantage`` leaves the update exactly as it was: with one optimizer
        step per rollout (the ratio to the old policy is 1), no KL and no SAPO term, a sample whose
        token advantages are all 0 adds exactly 0 to the PPO loss and its gradient; its tokens still
        count in the step's normalizer (``iter_grad_accum_global_norm`` sees every micro-batch), so
        the summed gradient of the others is the whole gradient. Otherwise nothing is skipped."""
        return (self.skip_zero_advantage and self.single_update and self.loss.kl_coef == 0
                and self.loss.sapo is None)

    @property
    def single_update(self) -> bool:
        """One optimizer step sees every sample of the rollout once: nothing changes the weights
        between sampling and scoring, so the update needs no separate old log-probs."""
        return self.optimizer_steps_per_rollout == 1


@dataclass
class MicroBatch:
    """Samples ``rows`` of the experience, padded together with their token-level tensors."""

    rows: list[int]
    batch: Batch
    old_log_probs: torch.Tensor | None  # None: the update's own detached log-probs (TrainConfig.single_update)
    advantages: torch.Tensor
    ref_log_probs: torch.Tensor | None


@dataclass
class StepResult:
    """Everything one step produced, per sample in prompt order (for records and inspection).

    ``experience`` holds the samples, their strata, rewards, blended / SAN / GN advantages,
    token advantages after CalibAdv and the old log-probs; ``updates`` one dict per optimizer
    step; ``sample_updates[i]`` one dict per pass over sample ``i`` (its mean ratio to the old
    policy, its largest |log ratio| and, with SAPO, its share of penalized tokens).
    """

    step: int
    experience: Experience
    updates: list[dict[str, float]]
    sample_updates: list[list[dict[str, float]]]
    record: dict


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


def _mean_info(samples, key: str) -> float:
    values = [s.info.get(key, 0.0) for s in samples]
    return sum(values) / max(1, len(values))


def _pad(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=rows[0].dtype)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r
    return out


def make_optimizer(model, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW, fused where the device supports it (one kernel, no per-step temporaries).

    Refuses weights below fp32: the runner keeps no fp32 master copy, and AdamW's small steps
    round away on bf16/fp16 weights (``load_policy``'s docstring has the measurement)."""
    params = [p for p in model.parameters() if p.requires_grad]
    low = sorted({str(p.dtype) for p in params if p.dtype != torch.float32})
    if low:
        raise ValueError(f"the single-machine runner trains fp32 weights; this model has {', '.join(low)} "
                         "(load it with load_policy(..., dtype=torch.float32))")
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


class LocalTrainer:
    """Stratified GRPO on one machine; ``train()`` runs (or resumes) up to ``cfg.steps`` steps."""

    def __init__(self, model, tokenizer, rollout: AgentRollout, questions: list[Question], cfg: TrainConfig,
                 out_dir: str | Path, logger: StepLogger | None = None):
        self.model, self.tokenizer, self.rollout, self.cfg = model, tokenizer, rollout, cfg
        self.out_dir = Path(out_dir)
        self.ckpt_dir = self.out_dir / "checkpoints"
        self.logger = logger or StepLogger(self.out_dir, config=asdict(cfg))
        self.objective = PolicyObjective(cfg.loss)
        self.optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)
        self.ref_model = self._reference(model) if cfg.loss.kl_coef > 0 else None
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.stream = PromptStream(questions, cfg.seed)
        self.step = 0
        self._mid_update = False  # an optimizer step of the unfinished step has changed the weights
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
            self._forget_steps_after(0)  # killed before the first checkpoint: start clean
            return False
        state = load_checkpoint(path, self.model, self.optimizer)
        self.step, self.stream.cursor = int(state["step"]), int(state["cursor"])
        self._forget_steps_after(self.step)
        if self.ref_model is not None and (path / "reference.pt").exists():
            self.ref_model.load_state_dict(torch.load(path / "reference.pt", weights_only=True))
        self.rollout.sync_weights(self.model)  # the engine generates with the checkpoint's weights
        log.info("resumed from %s at step %d", path, self.step)
        return True

    def _forget_steps_after(self, step: int) -> None:
        """Steps after the checkpoint are redone: their metrics lines and records go first
        (:mod:`.run_files`; a driver killed by SIGKILL leaves them)."""
        dropped = forget_steps_after(self.out_dir, step)
        if any(dropped.values()):
            log.info("resume at step %d: dropped %d metrics line(s) and %d rollout record file(s) of "
                     "later steps, which are redone", step, dropped["metrics_lines"], dropped["record_files"])

    def save(self) -> Path:
        path = save_checkpoint(self.ckpt_dir, self.step, self.model, self.optimizer,
                               {"cursor": self.stream.cursor, "config": asdict(self.cfg)},
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
                record = self.train_step().record
                records.append(record)
                bar.update(1)
                bar.set_postfix(reward=f"{record['reward']:.3f}", em=f"{record['em']:.2f}",
                                tools=f"{record['tool_calls']:.2f}",
                                strata=f"{record.get('sgrpo/strata_per_prompt', float('nan')):.2f}")
                if self.step % self.cfg.save_every == 0 or self.step == self.cfg.steps:
                    self.save()
        except KeyboardInterrupt:
            self.optimizer.zero_grad(set_to_none=True)  # a half-accumulated mini-batch is dropped
            if self._mid_update:  # some of this step's optimizer steps ran: the weights are no step's
                kept = latest_checkpoint(self.ckpt_dir)
                bar.write(f"interrupted during step {self.step + 1}'s update; the last checkpoint "
                          f"({kept.name if kept else 'none'}) is kept; rerun with --resume")
            else:
                path = self.save()
                bar.write(f"interrupted: checkpoint of step {self.step} saved in {path}; rerun with --resume")
            raise
        finally:
            bar.close()
        return records

    def train_step(self) -> StepResult:
        cfg = self.cfg
        questions = self.stream.take(cfg.prompts_per_step)
        step = self.step + 1
        # seeded by step: a rerun or a resume samples the same draws, whatever the engine's batching
        result = self.rollout.run([q.question for q in questions], [q.golds for q in questions], n=cfg.n_samples,
                                  desc=f"rollout {step}", seed=self._step_seed(step))
        samples = result.samples
        with Stopwatch() as exp_time:
            exp = make_experience(samples, cfg.n_samples, cfg.adv, self.model, self.pad_id, cfg.micro_batch_size,
                                  self.ref_model, old_from_update=cfg.single_update,
                                  generator=strata_generator(cfg.seed, step))
        with Stopwatch() as upd_time:
            updates, sample_updates = self._ppo_train(exp, step)
        # the next rollout samples from the updated policy, as OpenRLHF's broadcast_to_vllm after fit
        sync_s = self.rollout.sync_weights(self.model) if updates else 0.0
        self.step, self._mid_update = step, False
        adv = exp.advantage
        record = {
            "reward": float(adv.rewards.mean()), "reward_std": float(adv.rewards.std()) if len(samples) > 1 else 0.0,
            "em": _mean_info(samples, K.EM), "f1": _mean_info(samples, K.F1),
            "tool_calls": _mean_info(samples, K.TOOL_CALLS), "search_calls": _mean_info(samples, K.SEARCH_CALLS),
            "answered": _mean_info(samples, K.ANSWERED), "action_tokens": _mean_info(samples, K.ACTION_TOKENS),
            "tool_errors": _mean_info(samples, K.TOOL_ERRORS), **_fault_counts(samples),
            "total_length": sum(s.total_length for s in samples) / len(samples),
            "scripted_samples": sum(s.scripted for s in samples),
            "strata_hist": _histogram(adv.strata.tolist()),
            **adv.metrics, **exp.calibadv_stats, **_mean_over_updates(updates), **result.timing,
            "optimizer_steps": len(updates), "updates": updates, "lr": cfg.lr,
            "time/experience_s": exp_time.seconds, "time/update_s": upd_time.seconds,
            "time/weight_sync_s": sync_s,
        }
        record = self.logger.log(step, record)
        if cfg.record_groups:
            self._write_records(step, questions, exp, sample_updates)
        return StepResult(step, exp, updates, sample_updates, record)

    def _write_records(self, step: int, questions: list[Question], exp: Experience,
                       sample_updates: list[list[dict]]) -> None:
        """The step's first ``record_groups`` prompt groups for the inspector; SAPO's share is the
        last pass's (the ratio furthest from the sampling policy)."""
        sapo = None
        if self.cfg.loss.sapo is not None:
            sapo = [{"penalized_share": passes[-1]["sapo_penalized_share"],
                     "ratio_mean": passes[-1]["ratio_mean"]} if passes else None for passes in sample_updates]
        groups = records_from_samples(
            exp.samples, self.tokenizer, self.cfg.n_samples, phase="train", step=step, adv_cfg=self.cfg.adv,
            advantages=exp.advantage.advantages, token_advantages=exp.token_advantages, sapo=sapo,
            prompt_ids=[q.qid for q in questions], max_groups=self.cfg.record_groups,
            strata=exp.advantage.strata.tolist())
        RolloutWriter(self.out_dir).write_step("train", step, groups)

    # ------------------------------------------------------------ update (ActorPPOTrainer.ppo_train)
    def _group_order(self, n: int, generator: torch.Generator) -> list[int]:
        """Sample indices with the prompt groups in a shuffled order, each group kept whole."""
        group = self.cfg.n_samples
        groups = torch.randperm(n // group, generator=generator).tolist()
        return [g * group + k for g in groups for k in range(group)]

    def _micro_batch(self, exp: Experience, rows: list[int]) -> MicroBatch:
        batch = collate([exp.samples[i] for i in rows], self.pad_id)
        width = batch.action_mask.shape[1]
        ref = _pad([exp.ref_log_probs[i] for i in rows], width) if exp.ref_log_probs is not None else None
        old = _pad([exp.old_log_probs[i] for i in rows], width) if exp.old_log_probs is not None else None
        return MicroBatch(rows, batch, old, _pad([exp.token_advantages[i] for i in rows], width), ref)

    def _step_seed(self, step: int) -> int:
        """Step ``step``'s seed: its rollout's draws and its mini-batch order."""
        return self.cfg.seed * 1_000_003 + step

    def _ppo_train(self, exp: Experience, step: int) -> tuple[list[dict], list[list[dict]]]:
        """``max_epochs`` passes of mini-batch AdamW steps over one experience."""
        cfg = self.cfg
        n, micro = len(exp.samples), cfg.micro_batch_size
        gas = cfg.mini_batch_size // micro
        generator = torch.Generator().manual_seed(self._step_seed(step))
        updates: list[dict] = []
        sample_updates: list[list[dict]] = [[] for _ in range(n)]
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        try:
            for _ in range(cfg.max_epochs):
                # one optimizer step over the whole rollout: micro-batches of similar lengths pad
                # less (the sum of their gradients does not depend on how samples are grouped);
                # with shared_prefix a micro-batch holds one prompt's samples (their lengths sorted)
                if cfg.single_update and cfg.shared_prefix:
                    group = cfg.n_samples
                    order = [i for lo in range(0, n, group)
                             for i in sorted(range(lo, lo + group), key=lambda i: exp.samples[i].total_length)]
                elif cfg.single_update:
                    order = sorted(range(n), key=lambda i: exp.samples[i].total_length)
                else:
                    order = self._group_order(n, generator)
                items = [self._micro_batch(exp, order[lo: lo + micro]) for lo in range(0, n, micro)]
                window: list[tuple[MicroBatch, dict]] = []
                for item, info in iter_grad_accum_global_norm(items, None, gas, lambda it: it.batch.action_mask):
                    window.append((item, self._backward(item, info, gas, sample_updates)))
                    if len(window) == gas:
                        updates.append(self._optimizer_step(window, gas))
                        window = []
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            self.model.eval()
        return updates, sample_updates

    def _backward(self, item: MicroBatch, info: dict, gas: int, sample_updates: list[list[dict]]) -> dict:
        """One micro-batch's loss and backward (scaled by 1/gas like DeepSpeed's); its stats."""
        mask = item.batch.action_mask
        tokens = float(mask.sum())
        if tokens == 0 or float(info["batch_num_tokens"]) == 0:
            return {"_tokens": 0.0}
        if self.cfg.skips_exactly:
            live = [j for j in range(len(item.rows)) if bool((item.advantages[j] * mask[j]).any())]
            if len(live) < len(item.rows):
                return self._backward_live(item, live, info, gas, sample_updates, tokens)
        logp = (action_log_probs_shared if self.cfg.shared_prefix else action_log_probs)(self.model, item.batch)
        device = logp.device
        info = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in info.items()}
        old = logp.detach() if item.old_log_probs is None else item.old_log_probs.to(device)
        adv, mask = item.advantages.to(device), mask.to(device)
        ref = item.ref_log_probs.to(device) if item.ref_log_probs is not None else None
        loss, stats = self.objective(logp, old, adv, mask, info, ref_log_probs=ref)
        (loss / gas).backward()
        log_ratio = (logp.detach() - old) * mask
        stats["log_ratio_max"] = float(log_ratio.abs().max())
        self._per_sample(item, log_ratio, logp.detach(), old, adv, mask, sample_updates)
        return {**stats, "_tokens": tokens}

    def _backward_live(self, item: MicroBatch, live: list[int], info: dict, gas: int,
                       sample_updates: list[list[dict]], tokens: float) -> dict:
        """:meth:`_backward` over the micro-batch's rows with a nonzero advantage only
        (``TrainConfig.skips_exactly``). The skipped rows' ratio is exactly 1 and their loss 0, so
        their per-sample entries are written as such, and the token-mean stats are rescaled to the
        whole micro-batch's tokens (the skipped ones contribute 0 to each)."""
        skipped = [j for j in range(len(item.rows)) if j not in live]
        for j in skipped:
            entry = {"ratio_mean": 1.0, "log_ratio_max": 0.0}
            if self.cfg.loss.sapo is not None:
                entry["sapo_penalized_share"] = 0.0
            sample_updates[item.rows[j]].append(entry)
        if not live:
            return {"_tokens": tokens, "_skipped_rows": float(len(skipped))}
        sub = self._micro_batch_of(item, live)
        stats = self._backward(sub, info, gas, sample_updates)
        share = stats["_tokens"] / tokens
        out = {k: (v if k in LOSS_TERMS or k == "log_ratio_max" or k.startswith("_") else v * share)
               for k, v in stats.items()}
        return {**out, "_tokens": tokens, "_skipped_rows": float(len(skipped))}

    @staticmethod
    def _micro_batch_of(item: MicroBatch, keep: list[int]) -> MicroBatch:
        """The rows ``keep`` of a micro-batch, re-padded to their own width."""
        width = int(item.batch.attention_mask[keep].sum(1).max())
        cut = lambda t: t[keep][:, : width - 1] if t is not None else None  # noqa: E731 - [B, L-1] tensors
        batch = Batch(item.batch.sequences[keep][:, :width], item.batch.attention_mask[keep][:, :width],
                      cut(item.batch.action_mask))
        return MicroBatch([item.rows[j] for j in keep], batch, cut(item.old_log_probs), cut(item.advantages),
                          cut(item.ref_log_probs))

    def _per_sample(self, item: MicroBatch, log_ratio, logp, old, adv, mask, sample_updates) -> None:
        counts = mask.sum(-1).clamp_min(1)
        ratio_mean = (log_ratio.exp() * mask).sum(-1) / counts
        sapo = self.cfg.loss.sapo
        penalized = (penalized_mask(logp, old, adv, mask, sapo.ratio_threshold).sum(-1) / counts
                     if sapo is not None else None)
        for j, row in enumerate(item.rows):
            entry = {"ratio_mean": float(ratio_mean[j]), "log_ratio_max": float(log_ratio[j].abs().max())}
            if penalized is not None:
                entry["sapo_penalized_share"] = float(penalized[j])
            sample_updates[row].append(entry)

    def _optimizer_step(self, window: list[tuple[MicroBatch, dict]], gas: int) -> dict:
        """Clip, step, zero; the step's stats (loss terms summed after 1/gas, the rest token means)."""
        tokens = sum(stats["_tokens"] for _, stats in window)
        if tokens == 0:
            self.optimizer.zero_grad(set_to_none=True)
            return {"skipped": 1.0, "tokens": 0.0}
        skipped_rows = sum(stats.get("_skipped_rows", 0.0) for _, stats in window)
        if skipped_rows:  # a parameter no live row reached has the full pass's exact zero gradient
            for param in self.model.parameters():
                if param.requires_grad and param.grad is None:
                    param.grad = torch.zeros_like(param)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self._mid_update = True
        self.optimizer.zero_grad(set_to_none=True)
        out: dict[str, float] = {}
        for _, stats in window:
            for k, v in stats.items():
                if k.startswith("_"):
                    continue
                if k == "log_ratio_max":
                    out[k] = max(out.get(k, 0.0), v)
                elif k in LOSS_TERMS:
                    out[k] = out.get(k, 0.0) + v / gas
                else:
                    out[k] = out.get(k, 0.0) + v * stats["_tokens"] / tokens
        if skipped_rows:  # a stat no live row wrote (a window of skipped rows only): the full pass's, exactly
            for k in SKIPPED_ROW_STATS:  # (ratio 1, advantage 0: no loss, no clipping, no KL, log ratio 0)
                out.setdefault(k, 0.0)
        out = {**out, "grad_norm": float(grad_norm), "tokens": tokens}
        if self.cfg.skips_exactly:
            out["zero_advantage_samples_skipped"] = skipped_rows
        return out


def _mean_over_updates(updates: list[dict]) -> dict[str, float]:
    """Token-weighted means over the optimizer steps (grad_norm: the last one's, as OpenRLHF logs)."""
    live = [u for u in updates if u.get("tokens", 0) > 0]
    if not live:
        return {"skipped_update": 1.0}
    total = sum(u["tokens"] for u in live)
    keys = {k for u in live for k in u} - {"tokens", "grad_norm", "log_ratio_max"}
    out = {k: sum(u.get(k, 0.0) * u["tokens"] for u in live) / total for k in sorted(keys)}
    out["grad_norm"] = live[-1]["grad_norm"]
    out["log_ratio_max"] = max(u["log_ratio_max"] for u in live)
    return out


def _fault_counts(samples) -> dict[str, int]:
    """How many calls failed (per tool) and how many trajectories the time cap ended: a tool
    outage shows in the step's record as a burst of these."""
    keys = {"tool_errors_total": K.TOOL_ERRORS, "search_errors_total": K.SEARCH_ERRORS,
            "code_errors_total": K.CODE_ERRORS, "capped_total": K.CAPPED}
    return {name: int(sum(s.info.get(key, 0) for s in samples)) for name, key in keys.items()}


def _histogram(values: list[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))
