"""Passages by row number without loading the corpus: a jsonl file plus an offsets array.

``docs.jsonl`` holds one ``{"id", "contents"}`` per line in index-row order; ``offsets.npy``
(int64, n+1 entries, memory-mapped) says where each line starts. ``os.pread`` makes reads
thread-safe without a lock.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

DOCS_FILE = "docs.jsonl"
OFFSETS_FILE = "offsets.npy"


class DocStoreWriter:
    """Streams rows into ``docs.jsonl`` + ``offsets.npy``; files appear atomically on close."""

    def __init__(self, out_dir: str | Path) -> None:
        self.out_dir = Path(out_dir)
        self._tmp = self.out_dir / (DOCS_FILE + ".part")
        self._f = open(self._tmp, "wb")
        self._offsets = [0]

    def add(self, row: dict[str, str]) -> None:
        line = json.dumps({"id": row["id"], "contents": row["contents"]}, ensure_ascii=False) + "\n"
        self._f.write(line.encode("utf-8"))
        self._offsets.append(self._f.tell())

    def close(self) -> int:
        """Finish the files; returns the passage count."""
        self._f.close()
        np.save(self.out_dir / OFFSETS_FILE, np.asarray(self._offsets, dtype=np.int64))
        self._tmp.replace(self.out_dir / DOCS_FILE)
        return len(self._offsets) - 1


def write_docstore(rows: Iterable[dict[str, str]], out_dir: str | Path) -> int:
    """Write the docstore for ``rows`` (streamed); returns the passage count."""
    w = DocStoreWriter(out_dir)
    for row in rows:
        w.add(row)
    return w.close()


class DocStore:
    """Random access to passages by index row."""

    def __init__(self, directory: str | Path) -> None:
        d = Path(directory)
        self.path = d / DOCS_FILE
        self._offsets = np.load(d / OFFSETS_FILE, mmap_mode="r")
        self._fd = os.open(self.path, os.O_RDONLY)
        size = os.fstat(self._fd).st_size
        if len(self._offsets) == 0 or int(self._offsets[-1]) != size:
            raise ValueError(f"docstore {self.path} is {size} bytes but its offsets end at "
                             f"{int(self._offsets[-1]) if len(self._offsets) else 'nothing'}: rebuild the index")

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get(self, row: int) -> dict[str, str]:
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} outside docstore of {len(self)} passages")
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        return json.loads(os.pread(self._fd, end - start, start))

    def get_many(self, rows: Sequence[int]) -> list[dict[str, str]]:
        return [self.get(int(r)) for r in rows]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:  # best effort: the fd is per-process anyway
        try:
            self.close()
        except Exception:
            pass
