"""The demo's retrieval corpus: every evidence page of the selected questions plus distractors.

Encoding all 10,033 extracts with MiniLM takes ~6 min on 2 cores, too much of a 15-minute demo;
the evidence pages (312) plus a seeded sample of other extracts keep retrieval a real search
over a few thousand passages. The corpus file and its index are cached under
``assets.cache_dir()`` keyed by their content, so a second run reuses them.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from openrlhf_sgrpo.assets import cache_dir, part_path
from retriever_server.corpora import make_contents


def write_corpus(extracts: dict[str, str], evidence_titles: set[str], n_distractors: int, seed: int = 0,
                 out_dir: Path | None = None) -> Path:
    """Write (or reuse) ``corpus_<digest>.jsonl`` holding the evidence pages and distractors."""
    missing = sorted(evidence_titles - set(extracts))
    if missing:
        raise ValueError(f"evidence pages not among the extracts: {missing[:5]}")
    others = sorted(t for t in extracts if t not in evidence_titles and extracts[t].strip())
    if n_distractors < 0:
        raise ValueError(f"n_distractors must be >= 0, got {n_distractors}")
    picked = random.Random(seed).sample(others, min(n_distractors, len(others)))
    titles = sorted(evidence_titles) + sorted(picked)
    rows = [json.dumps({"id": str(i), "contents": make_contents(t, extracts[t].strip())}, ensure_ascii=False)
            for i, t in enumerate(titles)]
    text = "\n".join(rows) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    out_dir = out_dir or cache_dir() / "demo"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"corpus_{digest}.jsonl"
    if not path.exists():
        tmp = part_path(path)
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return path

