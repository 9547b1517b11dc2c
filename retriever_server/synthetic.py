"""Deterministic synthetic "embeddings" with cluster structure, for measuring the retriever at
wiki-18 scale where 21M real E5 vectors cannot be computed (2 CPU cores encode ~10 passages/s).

Row ``i`` is generated from its block alone (``BLOCK_ROWS`` rows per block, seeded by
``(seed, block)``), so any chunk of any size can be regenerated without the rows before it: the
21M serving index is built by streaming these straight into the IVF builder, with no 64 GB source
file on disk. Each vector is

    normalize(a * mu + b * C[topic] + c * (P[h1(topic, sub)] + P[h2(topic, sub)]) / sqrt(2) + s * noise)

with ``mu`` a direction shared by every row (real E5 vectors are anisotropic: unrelated passages
still have cosine ~0.7), 1,024 topics, 256 sub-topics per topic (so ~80 rows per sub-topic at
21M, ~8 at 2M: the corpus grows denser as it grows, like a real one) built from a 4,096-entry
table so no per-sub-topic table is stored, and uniform noise (cheaper to draw than Gaussian; in
768 dimensions the sum is as good as Gaussian).

How it differs from real E5 embeddings (docs/retriever.md says the same): isotropic noise around
each sub-topic (real neighbourhoods are anisotropic and heavy-tailed, with hubs), no
near-duplicate passages, queries drawn from the passages' own distribution (real E5 queries are
encoded with ``query:`` and sit apart from passages), and every pair of topics equally far apart.
Recall measured on it is therefore a property of the index on *this* distribution, not a promise
about wiki-18.

**The hard distribution** (``kind=hard``, issue #49) adds what the list above says is missing,
so recall measured on it is not flattered: (1) the noise is anisotropic, Gaussian with a
power-law spectrum in a random orthonormal basis (a few directions carry most of the spread,
as in real embeddings); (2) topics and sub-topics have Zipf-distributed sizes (a few huge
clusters, a long tail); (3) each row's noise scale is log-normal, so rows near their centre
become hubs; (4) ``HARD.dup_share`` of the rows are near-duplicates of another row of the same
block; (5) queries are drawn differently from passages: a ``query:`` offset direction shared by
all queries, topics drawn uniformly (questions are not distributed like passages), and each
query sits between two sub-topics of its topic (its top-3 straddles clusters). The numbers in
:data:`HARD` are justified against real E5 statistics in docs/retriever.md.

Model names ``synthetic-clusters:dim=768,seed=0`` (``,kind=hard`` for the hard one) select :class:`SyntheticEncoder`, which maps a
query text to a held-out vector of the same distribution (hash of the text -> topic, sub-topic,
noise) and ``synthetic passage <row>`` to row ``<row>``: the server can then be measured
end to end through ``/retrieve`` with the encoder's cost taken out ("search-only").
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from pathlib import Path

import numpy as np

from .profiles import Profile

MODEL_PREFIX = "synthetic-clusters:"
BLOCK_ROWS = 8192
TOPICS = 1024
SUBTOPICS = 256
TABLE = 4096
WEIGHTS = (0.55, 0.6, 0.45, 0.6)  # a (shared direction), b (topic), c (sub-topic), s (noise)
_PASSAGE = re.compile(r"synthetic passage (\d+)\b")
KINDS = ("easy", "hard")


@dataclass(frozen=True)
class HardParams:
    """The hard distribution's knobs (docs/retriever.md compares them with real E5 statistics)."""

    mu: float = 1.8  # shared direction: sets the mean cosine of unrelated rows (real E5: ~0.76)
    topic: float = 0.5
    sub: float = 0.45
    noise: float = 0.75  # median norm of a row's noise before normalizing
    spectrum: float = 1.0  # noise variance of principal direction j ~ (j + 1) ** -spectrum
    zipf_topic: float = 1.0  # P(topic rank r) ~ (r + 1) ** -zipf
    zipf_sub: float = 0.8
    scale_sigma: float = 0.4  # log-normal spread of each row's noise scale (small ones: hubs)
    dup_share: float = 0.06  # rows that are near-duplicates of another row of their block
    dup_noise: float = 0.08
    query_offset: float = 0.35  # the `query:` direction every query shares
    query_noise: float = 0.9


HARD = HardParams()


@dataclass(frozen=True)
class SyntheticSpec:
    dim: int = 768
    seed: int = 0
    kind: str = "easy"

    @property
    def model_name(self) -> str:
        extra = f",kind={self.kind}" if self.kind != "easy" else ""
        return f"{MODEL_PREFIX}dim={self.dim},seed={self.seed}{extra}"

    @classmethod
    def from_model_name(cls, name: str) -> SyntheticSpec:
        if not name.startswith(MODEL_PREFIX):
            raise ValueError(f"{name!r} is not a synthetic model name ({MODEL_PREFIX}dim=N,seed=N[,kind=hard])")
        try:
            kv = dict(part.split("=", 1) for part in name[len(MODEL_PREFIX):].split(",") if part)
            kind = kv.get("kind", "easy")
            if kind not in KINDS:
                raise ValueError
            return cls(dim=int(kv.get("dim", 768)), seed=int(kv.get("seed", 0)), kind=kind)
        except ValueError:
            raise ValueError(f"bad synthetic model name {name!r}: expected "
                             f"{MODEL_PREFIX}dim=N,seed=N[,kind=easy|hard]") from None


def _hash(a: np.ndarray, salt: int) -> np.ndarray:
    """A cheap vectorized integer hash (splitmix-style) → [0, TABLE)."""
    x = (a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(salt)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    x ^= x >> np.uint64(31)
    x = (x * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    x ^= x >> np.uint64(29)
    return (x % np.uint64(TABLE)).astype(np.int64)


class SyntheticVectors:
    """Rows of the synthetic corpus by range, and held-out query vectors by text."""

    def __init__(self, spec: SyntheticSpec = SyntheticSpec(), ntotal: int = 0) -> None:
        self.spec, self.dim, self.ntotal = spec, spec.dim, ntotal
        self.model = spec.model_name
        rng = np.random.default_rng([spec.seed, 7])
        self.mu = self._unit(rng.standard_normal((1, spec.dim), dtype=np.float32))[0]
        self.topics = self._unit(rng.standard_normal((TOPICS, spec.dim), dtype=np.float32))
        self.table = self._unit(rng.standard_normal((TABLE, spec.dim), dtype=np.float32))
        if spec.kind == "hard":
            h = HARD
            basis, _ = np.linalg.qr(rng.standard_normal((spec.dim, spec.dim)))  # a random orthonormal basis
            sd = (np.arange(spec.dim) + 1.0) ** (-h.spectrum / 2)
            sd *= h.noise / np.sqrt((sd ** 2).sum())  # expected noise norm = h.noise
            self.noise_map = np.ascontiguousarray((sd[:, None] * basis.T), dtype=np.float32)  # z @ this
            self.topic_p = self._zipf(TOPICS, h.zipf_topic)
            self.sub_p = self._zipf(SUBTOPICS, h.zipf_sub)
            self.topic_perm = rng.permutation(TOPICS)  # big clusters are not the low ids
            self.query_dir = self._unit(rng.standard_normal((1, spec.dim), dtype=np.float32))[0]

    @staticmethod
    def _zipf(n: int, a: float) -> np.ndarray:
        p = (np.arange(n) + 1.0) ** -a
        return np.cumsum(p / p.sum())
    @staticmethod
    def _unit(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    def identity(self) -> dict[str, object]:
        return {"source": self.spec.model_name, "ntotal": self.ntotal, "dim": self.dim}

    def _sub_vec(self, sub: np.ndarray) -> np.ndarray:
        return (self.table[_hash(sub, 1)] + self.table[_hash(sub, 2)]) / np.float32(np.sqrt(2.0))

    def _make_hard(self, rng: np.random.Generator, n: int, query: bool) -> tuple[np.ndarray, np.ndarray]:
        h = HARD
        if query:  # questions are not distributed like passages: any topic, any sub-topic
            topic = rng.integers(0, TOPICS, n)
            sub = topic * SUBTOPICS + rng.integers(0, SUBTOPICS, n)
            sub2 = topic * SUBTOPICS + rng.integers(0, SUBTOPICS, n)
        else:
            topic = self.topic_perm[np.searchsorted(self.topic_p, rng.random(n), side="right").clip(0, TOPICS - 1)]
            sub = topic * SUBTOPICS + np.searchsorted(self.sub_p, rng.random(n), side="right").clip(0, SUBTOPICS - 1)
        z = rng.standard_normal((n, self.dim), dtype=np.float32)
        x = z @ self.noise_map  # anisotropic: power-law spectrum in a random basis
        if query:
            x *= np.float32(h.query_noise / h.noise)
            x += h.sub * (self._sub_vec(sub) + self._sub_vec(sub2)) / np.float32(np.sqrt(2.0))
            x += h.query_offset * self.query_dir
        else:
            x *= rng.lognormal(0.0, h.scale_sigma, (n, 1)).astype(np.float32)
            x += h.sub * self._sub_vec(sub)
        x += h.mu * self.mu
        x += h.topic * self.topics[topic]
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        if not query and n > 1:  # near-duplicates: a copy of another row of this block, barely moved
            dup = np.flatnonzero(rng.random(n) < h.dup_share)
            src = rng.integers(0, n, len(dup))
            y = x[src] + h.dup_noise * (rng.standard_normal((len(dup), self.dim), dtype=np.float32)
                                        @ self.noise_map) / np.float32(h.noise)
            x[dup] = y / np.linalg.norm(y, axis=1, keepdims=True)
            topic[dup] = topic[src]
        return x, topic

    def _make(self, rng: np.random.Generator, n: int, query: bool = False) -> tuple[np.ndarray, np.ndarray]:
        if self.spec.kind == "hard":
            return self._make_hard(rng, n, query)
        a, b, c, s = WEIGHTS
        topic = rng.integers(0, TOPICS, n)
        sub = topic * SUBTOPICS + rng.integers(0, SUBTOPICS, n)
        x = rng.random((n, self.dim), dtype=np.float32)
        x -= 0.5
        x *= np.float32(s * np.sqrt(12.0 / self.dim))  # uniform noise of norm ~s
        x += a * self.mu
        x += b * self.topics[topic]
        x += (c / np.sqrt(2.0)) * (self.table[_hash(sub, 1)] + self.table[_hash(sub, 2)])
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x, topic

    def block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Block ``b``'s rows and their topics (the same for every caller and chunking)."""
        return self._make(np.random.default_rng([self.spec.seed, 1, b]), BLOCK_ROWS)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` (the :class:`~retriever_server.flat_file.FlatIPFile` interface)."""
        return self.rows_and_topics(start, stop)[0]

    def rows_and_topics(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        if stop <= start:
            return np.zeros((0, self.dim), np.float32), np.zeros(0, np.int64)
        xs, ts = [], []
        for b in range(start // BLOCK_ROWS, (stop - 1) // BLOCK_ROWS + 1):
            x, t = self.block(b)
            lo, hi = max(start - b * BLOCK_ROWS, 0), min(stop - b * BLOCK_ROWS, BLOCK_ROWS)
            xs.append(x[lo:hi])
            ts.append(t[lo:hi])
        return np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ts)

    def query(self, text: str) -> np.ndarray:
        """A held-out vector for ``text``: same distribution as the rows, never one of them."""
        h = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
        return self._make(np.random.default_rng([self.spec.seed, 2, h]), 1, query=True)[0][0]


def passage_text(row: int) -> str:
    """The synthetic passage for a row, in Search-R1's ``"Title"\\ntext`` layout."""
    return f'"Synthetic {row}"\nsynthetic passage {row}.'


class SyntheticEncoder:
    """The "model" of the synthetic corpus: text → its vector, at no compute cost."""

    def __init__(self, model: str, profile: Profile, **_: object) -> None:
        spec = SyntheticSpec.from_model_name(model)
        self.model, self.profile, self.device, self.dim = model, profile, "cpu", spec.dim
        self._vectors = SyntheticVectors(spec)

    def encode(self, texts, *, is_query: bool, batch_size: int = 64) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        rows: dict[int, list[int]] = {}  # passage rows by block: each block is generated once
        for i, t in enumerate(texts):
            m = None if is_query else _PASSAGE.search(t)
            if m:
                rows.setdefault(int(m.group(1)), []).append(i)
            else:
                out[i] = self._vectors.query(t)
        for b in sorted({r // BLOCK_ROWS for r in rows}):
            block = self._vectors.block(b)[0]
            for r in [r for r in rows if r // BLOCK_ROWS == b]:
                out[rows[r]] = block[r - b * BLOCK_ROWS]
        return out


def corpus_lines(start: int, stop: int) -> tuple[bytes, np.ndarray]:
    """Rows ``start:stop`` as Search-R1 corpus jsonl bytes (``{"id", "contents"}``; also our
    docstore's line format) and each line's length: 21M lines without a json.dumps per row."""
    lines = [f'{{"id": "{i}", "contents": "\\"Synthetic {i}\\"\\nsynthetic passage {i}."}}\n'
             for i in range(start, stop)]
    return "".join(lines).encode("ascii"), np.fromiter(map(len, lines), dtype=np.int64, count=len(lines))


def write_search_r1_pair(vecs: SyntheticVectors, work: Path, chunk_rows: int = 65_536) -> tuple[Path, Path]:
    """``work/corpus.jsonl`` and ``work/flat.index`` for every row of ``vecs``: the two files
    Search-R1 ships (a corpus and its IndexFlatIP, row i = line i), small enough for RAM per chunk;
    what the import tests start from. The scale bench writes the same pair with progress and the
    exact top-k kept on the way."""
    from .flat_file import FlatIPWriter

    work = Path(work)
    data, _ = corpus_lines(0, vecs.ntotal)
    (work / "corpus.jsonl").write_bytes(data)
    w = FlatIPWriter(work / "flat.index", vecs.dim, vecs.ntotal)
    for s in range(0, vecs.ntotal, chunk_rows):
        w.write(vecs.read(s, min(vecs.ntotal, s + chunk_rows)))
    w.close()
    return work / "corpus.jsonl", work / "flat.index"
