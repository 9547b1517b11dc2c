"""HF-transformers generation engine with vLLM's `generate` contract, for single-machine runs.

OpenRLHF's MultiTurnAgentExecutor awaits `engine.generate(prompt_token_ids, sampling_params)`
once per turn and many trajectories run concurrently in one asyncio loop. This engine queues
those calls and serves them in padded batches (left padding, KV cache, rows pruned from the
batch as they finish) on a worker thread, so tool calls keep flowing on the loop meanwhile.
Prompts are prefilled ``prefill_chunk`` tokens at a time: a padded batch's attention scores are
``rows x heads x chunk x length`` instead of ``rows x heads x length x length`` (on CPU, 24 rows
of 600 tokens peaked at +2.4 GB in one prefill), for the same KV cache and logits.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from openrlhf_sgrpo.engine.sampling import CompletionOutput, Logprob, RequestOutput, SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    stop_hit: str | None = None
    generator: torch.Generator | None = None  # the request's own, where its params carry a seed


class HFGenerationEngine:
    """Batched sampling from a causal LM; `await generate(...)` returns a vLLM-like RequestOutput."""

    def __init__(self, model, tokenizer, max_batch: int = 32, device: str | torch.device | None = None,
                 batch_window_s: float = 0.002, seed: int = 0, prefill_chunk: int = 128):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.prefill_chunk = prefill_chunk
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.max_batch, self.batch_window_s = max_batch, batch_window_s
        self.eos_ids = self._eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids, default=0)
        self.max_positions = getattr(model.config, "max_position_embeddings", None) or 1 << 30
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._queue: list[_Request] = []
        self._worker: asyncio.Task | None = None
        self.batches_run = 0

    @staticmethod
    def _eos_ids(model, tokenizer) -> set[int]:
        ids = set()
        for source in (getattr(model, "generation_config", None), model.config, tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if value is None:
                continue
            ids.update(value if isinstance(value, (list, tuple)) else [value])
        return {int(i) for i in ids}

    def sync_weights(self, model) -> int:
        """The engine generates with the training model itself: nothing travels. A different
        model object is refused rather than silently ignored."""
        if model is not self.model:
            raise ValueError("HFGenerationEngine generates with the model it was built with; build a new "
                             "engine for another model")
        return 0

    def close(self) -> None:
        """Nothing to release (no processes, no KV cache between batches)."""

    # ------------------------------------------------------------ asyncio side
    async def generate(self, prompt_token_ids: list[int], sampling_params: SamplingParams,
                       multi_modal_data=None) -> RequestOutput:
        if multi_modal_data:
            raise ValueError("HFGenerationEngine is text-only; multi_modal_data is not supported")
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids is empty")
        loop = asyncio.get_running_loop()
        req = _Request(list(prompt_token_ids), sampling_params, loop.create_future())
        if sampling_params.seed is not None:
            req.generator = torch.Generator(device=self.device).manual_seed(sampling_params.seed)
        self._queue.append(req)
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._serve())
        return await req.future

    async def _serve(self) -> None:
        """Drain the queue in batches; calls that arrive while a batch runs wait for the next one."""
        while self._queue:
            await asyncio.sleep(self.batch_window_s)  # let concurrent callers join this batch
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch:]
            try:
                await asyncio.to_thread(self._run_batch, batch)
            except Exception as err:  # noqa: BLE001 - hand the error to every waiting caller
                for req in batch:
                    if not req.future.done():
                        req.future.set_exception(err)
                continue
            for req in batch:
                if not req.future.done():
                    req.future.set_result(self._to_output(req))

    # ------------------------------------------------------------ model side
    def _budget(self, req: _Request) -> int:
        limit = req.params.max_tokens
        room = self.max_positions - len(req.prompt)
        return max(0, min(limit, room) if limit is not None else room)

    @torch.inference_mode()
    def _run_batch(self, batch: list[_Request]) -> None:
        self.batches_run += 1
        live = [r for r in batch if self._budget(r) > 0]
        for r in batch:
            if r not in live:
                r.finish = "length"
        if not live:
            return
        width = max(len(r.prompt) for r in live)
        ids = torch.full((len(live), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(live), width), dtype=torch.long)
        for i, r in enumerate(live):
            ids[i, width - len(r.prompt):] = torch.tensor(r.prompt)
            mask[i, width - len(r.prompt):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        cache = DynamicCache()
        for start in range(0, width, self.prefill_chunk):  # chunked prefill, see the module docstring
            end = min(start + self.prefill_chunk, width)
            logits = self._forward(ids[:, start:end], mask[:, :end], cache)
        while True:
            tokens, logps = self._sample(logits, live)
            keep = []
            for i, r in enumerate(live):
                r.tokens.append(int(tokens[i]))
                r.logprobs.append(float(logps[i]))
                if not self._check_finished(r):
                    keep.append(i)
            if not keep:
                return
            step = tokens.to(self.device).unsqueeze(1)
            if len(keep) < len(live):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, step = mask[index], step[index]
                live = [live[i] for i in keep]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
            logits = self._forward(step, mask, cache)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Last-position logits (float32); positions count only real tokens (left padding)."""
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1]:]
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def _sample(self, logits: torch.Tensor, reqs: list[_Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row temperature / top-k / top-p sampling; log-probs of the tempered distribution."""
        for i, r in enumerate(reqs):  # EOS is not allowed before min_tokens
            if (len(r.tokens) < r.params.min_tokens or r.params.ignore_eos) and self.eos_ids:
                logits[i, list(self.eos_ids)] = float("-inf")
        temps = torch.tensor([r.params.temperature for r in reqs], device=logits.device)
        greedy = temps < 1e-5
        scaled = logits / torch.where(greedy, torch.ones_like(temps), temps).unsqueeze(1)
        logp_all = torch.log_softmax(scaled, dim=-1)
        filtered = self._top_k_top_p(scaled, reqs)
        # Exponential race (argmax p/E, E ~ Exp(1)) samples from `probs` like torch.multinomial
        # but is several times faster over a 150k vocabulary on CPU.
        probs = torch.softmax(filtered, dim=-1)
        race = torch.empty_like(probs)
        # vLLM's rule: a seeded request draws from its own generator, so its tokens do not depend on
        # what it is batched with; the engine's generator draws only for the others. The trainer
        # seeds every request: drawing for the whole batch, then again per seeded row, made the
        # sampler 1.8x slower and generate 10 % (SmolLM2, 16 rows; bench/hf_seeded_sampling.py)
        unseeded = [i for i, r in enumerate(reqs) if r.generator is None]
        if len(unseeded) == len(reqs):
            race.exponential_(generator=self.generator)
        elif unseeded:
            race[unseeded] = torch.empty_like(race[unseeded]).exponential_(generator=self.generator)
        for i, r in enumerate(reqs):
            if r.generator is not None:
                race[i].exponential_(generator=r.generator)
        sampled = (probs / race).argmax(dim=-1)
        tokens = torch.where(greedy, scaled.argmax(dim=-1), sampled)
        return tokens.cpu(), logp_all.gather(1, tokens.unsqueeze(1)).squeeze(1).cpu()

    @staticmethod
    def _top_k_top_p(scaled: torch.Tensor, reqs: list[_Request]) -> torch.Tensor:
        vocab = scaled.shape[-1]
        ks = [r.params.top_k if r.params.top_k and r.params.top_k > 0 else vocab for r in reqs]
        if min(ks) < vocab:
            k = torch.tensor(ks, device=scaled.device).clamp(max=vocab)
            top = torch.topk(scaled, int(k.max()), dim=-1).values
            threshold = top.gather(1, (k - 1).unsqueeze(1))
            scaled = scaled.masked_fill(scaled < threshold, float("-inf"))
        ps = torch.tensor([r.params.top_p for r in reqs], device=scaled.device)
        if bool((ps < 1).any()):
            sorted_logits, order = torch.sort(scaled, descending=True, dim=-1)
            sorted_probs = torch.softmax(sorted_logits, dim=-1)
            drop = (sorted_probs.cumsum(-1) - sorted_probs) > ps.unsqueeze(1)
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            scaled = torch.empty_like(scaled).scatter_(1, order, sorted_logits)
        return scaled

    def _check_finished(self, r: _Request) -> bool:
        """Set `finish` on EOS / stop token / stop string / budget; True when the row is done."""
        p, last, n = r.params, r.tokens[-1], len(r.tokens)
        if n >= p.min_tokens:
            if (last in self.eos_ids and not p.ignore_eos) or last in (p.stop_token_ids or ()):
                r.finish, r.stop_hit = "stop", None
                return True
            stops = p.stop_strings
            if stops:
                window = max(len(s) for s in stops) + 1
                tail = self.tokenizer.decode(r.tokens[-window:], skip_special_tokens=False)
                hit = next((s for s in stops if s in tail), None)
                if hit is not None:
                    r.finish, r.stop_hit = "stop", hit
                    return True
        if n >= self._budget(r):
            r.finish = "length"
            return True
        return False

    def _to_output(self, r: _Request) -> RequestOutput:
        p = r.params
        text_ids = r.tokens
        if r.finish == "stop" and r.stop_hit is None and r.tokens:
            text_ids = r.tokens[:-1]  # vLLM leaves the EOS / stop token out of the text
        text = self.tokenizer.decode(text_ids, skip_special_tokens=p.skip_special_tokens)
        if r.stop_hit is not None:
            cut = text.find(r.stop_hit)
            if cut >= 0:
                text = text[: cut + (len(r.stop_hit) if p.include_stop_str_in_output else 0)]
        logprobs = None
        if p.logprobs is not None:
            logprobs = [{t: Logprob(lp)} for t, lp in zip(r.tokens, r.logprobs)]
        out = CompletionOutput(0, text, list(r.tokens), r.finish or "length", logprobs, r.stop_hit)
        return RequestOutput(list(r.prompt), [out])
