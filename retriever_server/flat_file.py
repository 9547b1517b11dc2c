"""Search-R1's ``e5_Flat.index`` read (and written) by byte offset, never as a whole.

``faiss.write_index`` lays an ``IndexFlatIP`` out as: fourcc ``IxFI``, ``d`` (int32), ``ntotal``
(int64), two int64 placeholders, ``is_trained`` (1 byte), ``metric_type`` (int32; 0 = inner
product), then the vector array as a size_t count of floats followed by ``ntotal x d`` float32,
row i at ``data_offset + 4 * d * i``. Reading the header ourselves lets a 64.5 GB file be
streamed in chunks through ``pread`` (RSS = one chunk) instead of ``faiss.read_index`` (RSS =
the file). :class:`FlatIPWriter` writes the same bytes chunk by chunk, so the bench can make a
file the way Search-R1 does at any size (the tests check it byte for byte against faiss).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FOURCC_FLAT_IP = b"IxFI"
# other fourccs a user might hand us, so the error can say what the file is
KNOWN_FOURCC = {b"IxF2": "IndexFlatL2 (L2 metric)", b"IxFl": "IndexFlat with another metric",
                b"IwFl": "IndexIVFFlat", b"IwPQ": "IndexIVFPQ", b"IwSq": "IndexIVFScalarQuantizer",
                b"IxSQ": "IndexScalarQuantizer", b"IHNf": "IndexHNSWFlat", b"IxPq": "IndexPQ",
                b"IxMp": "IndexIDMap", b"IxM2": "IndexIDMap2", b"IxRF": "IndexRefineFlat"}
_HEAD = struct.Struct("<4siqqq?i")  # fourcc, d, ntotal, dummy, dummy, is_trained, metric_type
_COUNT = struct.Struct("<Q")
DATA_OFFSET = _HEAD.size + _COUNT.size  # 45 bytes
METRIC_INNER_PRODUCT = 0
_PLACEHOLDER = 1 << 20  # what faiss writes in the two unused header fields


class FlatFileError(ValueError):
    """The file is not an IndexFlatIP we can stream; the message says what it is instead."""


@dataclass(frozen=True)
class FlatIPFile:
    """Where the vectors of an IndexFlatIP file lie; ``read`` returns rows by offset."""

    path: Path
    dim: int
    ntotal: int
    data_offset: int = DATA_OFFSET

    @property
    def nbytes(self) -> int:
        return self.data_offset + 4 * self.dim * self.ntotal

    def identity(self) -> dict[str, object]:
        st = self.path.stat()
        return {"source": str(self.path.resolve()), "source_bytes": st.st_size,
                "source_mtime_ns": st.st_mtime_ns, "ntotal": self.ntotal, "dim": self.dim}

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as float32 (one pread; the pages are then dropped from the cache,
        so a 64 GB pass does not evict everything else on the machine)."""
        if not 0 <= start <= stop <= self.ntotal:
            raise IndexError(f"rows {start}:{stop} outside 0:{self.ntotal}")
        out = np.empty((stop - start, self.dim), dtype=np.float32)
        view = memoryview(out).cast("B")
        off, want, got = self.data_offset + 4 * self.dim * start, out.nbytes, 0
        fd = os.open(self.path, os.O_RDONLY)
        try:
            while got < want:
                n = os.preadv(fd, [view[got:]], off + got)
                if n == 0:
                    raise FlatFileError(f"{self.path} ends at byte {off + got}, before row {stop}: truncated file")
                got += n
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, off, want, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return out


def open_flat_ip(path: str | Path) -> FlatIPFile:
    """Parse and check the header of a ``faiss.write_index``-ed IndexFlatIP without reading its data."""
    path = Path(path)
    if not path.is_file():
        raise FlatFileError(f"source index not found: {path}")
    with open(path, "rb") as f:
        head = f.read(DATA_OFFSET)
    if len(head) < 4:
        raise FlatFileError(f"{path} is {len(head)} bytes: not a FAISS index")
    fourcc = head[:4]
    if fourcc != FOURCC_FLAT_IP:
        what = KNOWN_FOURCC.get(fourcc, f"not a FAISS flat index (first bytes {fourcc!r})")
        raise FlatFileError(f"{path} is {what}, not an IndexFlatIP: import_index streams the exact "
                            "inner-product index Search-R1 ships (e5_Flat.index)")
    if len(head) < DATA_OFFSET:
        raise FlatFileError(f"{path} is {len(head)} bytes: its IndexFlatIP header is cut short")
    _, dim, ntotal, _, _, _, metric = _HEAD.unpack_from(head)
    (count,) = _COUNT.unpack_from(head, _HEAD.size)
    if metric != METRIC_INNER_PRODUCT:
        raise FlatFileError(f"{path} has metric_type {metric}, not inner product (0)")
    if dim <= 0 or ntotal < 0 or count != dim * ntotal:
        raise FlatFileError(f"{path}: header says d={dim}, ntotal={ntotal} but {count} floats follow")
    flat = FlatIPFile(path, int(dim), int(ntotal))
    size = path.stat().st_size
    if size != flat.nbytes:
        raise FlatFileError(f"{path} is {size} bytes; an IndexFlatIP of {ntotal} x {dim} is {flat.nbytes}: "
                            "truncated or not a plain IndexFlatIP")
    return flat


class FlatIPWriter:
    """Write an IndexFlatIP file chunk by chunk (``ntotal`` known up front); appears on ``close``."""

    def __init__(self, path: str | Path, dim: int, ntotal: int) -> None:
        self.path, self.dim, self.ntotal, self.written = Path(path), dim, ntotal, 0
        self._tmp = self.path.with_name(self.path.name + ".part")
        self._f = open(self._tmp, "wb")
        self._f.write(_HEAD.pack(FOURCC_FLAT_IP, dim, ntotal, _PLACEHOLDER, _PLACEHOLDER, True,
                                 METRIC_INNER_PRODUCT))
        self._f.write(_COUNT.pack(dim * ntotal))

    def write(self, x: np.ndarray) -> None:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.dim or self.written + len(x) > self.ntotal:
            raise ValueError(f"chunk of shape {x.shape} does not fit {self.ntotal} x {self.dim} "
                             f"after {self.written} rows")
        self._f.write(memoryview(x).cast("B"))
        self.written += len(x)

    def close(self) -> None:
        self._f.close()
        if self.written != self.ntotal:
            raise ValueError(f"wrote {self.written} of {self.ntotal} rows")
        self._tmp.replace(self.path)
