"""Merge IVF blocks into FAISS's on-disk inverted-lists file with plain file reads and writes.

Why not ``faiss.OnDiskInvertedLists.merge_from_multiple``: it writes its output through a shared
``mmap`` of the whole file, and reads the blocks through ``mmap`` too. Every page it touches then
counts in the process's resident set: at wiki-18 scale (21M x 768, SQ8) the peak RSS (VmHWM) was
16 GB for a conversion whose private memory never passed 2 GB, twice the 8 GB the import is
allowed. Here each block is read with ``pread`` and each list's slice written with ``pwrite``:
the bytes pass through the page cache, which is not the process's memory, and RAM holds one
block at a time.

The output is byte for byte the file FAISS's merge writes (the tests compare both), so the
server reads it exactly as before:

* ``index.ivfdata``: for list ``j`` in order, ``capacity_j x code_size`` bytes of codes, then
  ``capacity_j`` int64 ids, with capacity = size = the sum of the blocks' list sizes and the
  blocks' entries in block order (what ``merge_from_multiple(shift_ids=False)`` appends).
* the ``OnDiskInvertedLists`` FAISS serialises into ``index.faiss`` holds each list's
  (size, capacity, offset), the total size and the data file's name; :func:`ondisk_invlists`
  builds it from the sizes without opening or mapping the data file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ID_BYTES = 8  # faiss.idx_t


def _faiss():
    import faiss

    return faiss


@dataclass(frozen=True)
class BlockLists:
    """Where one block file (a ``write_index``-ed IVF index with array lists) keeps its lists:
    list ``j`` is ``sizes[j]`` codes then ``sizes[j]`` ids, starting at byte ``offsets[j]``."""

    path: Path
    sizes: np.ndarray  # int64, nlist
    offsets: np.ndarray  # int64, nlist
    code_size: int

    @property
    def data_range(self) -> tuple[int, int]:
        """The byte range holding every list (they are stored one after another, in list order)."""
        end = self.offsets + self.sizes * (self.code_size + ID_BYTES)
        return int(self.offsets[0]), int(end[-1])


def block_lists(path: str | Path) -> BlockLists:
    """The list sizes and file offsets of a block, read from its header only.

    FAISS's ``IO_FLAG_MMAP`` reads array lists as an ``OnDiskInvertedLists`` over the file, which
    records each list's offset; the mapping it makes is never touched here (no page of it becomes
    resident), and it is released when the index object is.
    """
    faiss = _faiss()
    index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    il = faiss.downcast_InvertedLists(faiss.extract_index_ivf(index).invlists)
    if not isinstance(il, faiss.OnDiskInvertedLists):
        raise RuntimeError(f"{path}: expected array inverted lists, got {type(il).__name__}")
    lists = il.lists
    sizes = np.fromiter((lists.at(j).size for j in range(il.nlist)), np.int64, il.nlist)
    offsets = np.fromiter((lists.at(j).offset for j in range(il.nlist)), np.int64, il.nlist)
    ends = offsets + sizes * (il.code_size + ID_BYTES)
    if il.nlist > 1 and not np.array_equal(offsets[1:], ends[:-1]):
        raise RuntimeError(f"{path}: inverted lists are not stored contiguously")
    out = BlockLists(Path(path), sizes, offsets, int(il.code_size))
    del il, lists, index
    return out


def list_layout(sizes: np.ndarray, code_size: int) -> tuple[np.ndarray, int]:
    """Each list's byte offset in the merged file and the file's total size
    (what ``OnDiskInvertedLists.set_all_lists_sizes`` computes)."""
    per = sizes.astype(np.int64) * (code_size + ID_BYTES)
    offsets = np.concatenate([[0], np.cumsum(per)[:-1]]).astype(np.int64)
    return offsets, int(per.sum())


def _pread_into(fd: int, buf: memoryview, offset: int, path: Path) -> None:
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], offset + got)
        if n == 0:
            raise RuntimeError(f"{path} ends at byte {offset + got}: truncated block")
        got += n


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)


def write_merged_lists(blocks: list[BlockLists], out_path: str | Path,
                       on_block: Callable[[int], None] | None = None) -> np.ndarray:
    """Write every block's lists into ``out_path`` in the on-disk layout; returns the list sizes.

    RAM: one block's list data (chunk_rows x (code_size + 8) bytes, ~200 MB for 262,144 SQ8 rows
    of 768-d) plus the layout arrays. The output is fsynced before this returns, so a rename that
    follows publishes complete bytes.
    """
    if not blocks:
        raise ValueError("no blocks to merge")
    cs, nlist = blocks[0].code_size, len(blocks[0].sizes)
    for b in blocks:
        if b.code_size != cs or len(b.sizes) != nlist:
            raise RuntimeError(f"{b.path}: {len(b.sizes)} lists of {b.code_size} B, expected {nlist} of {cs} B")
    sizes = np.sum([b.sizes for b in blocks], axis=0).astype(np.int64)
    offsets, total = list_layout(sizes, cs)
    ids_at = offsets + sizes * cs  # where list j's ids start
    filled = np.zeros(nlist, np.int64)  # entries of list j written so far
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, total)
        for bi, b in enumerate(blocks):
            lo, hi = b.data_range
            buf = np.empty(hi - lo, np.uint8)
            src = os.open(b.path, os.O_RDONLY)
            try:
                _pread_into(src, memoryview(buf), lo, b.path)
                if hasattr(os, "posix_fadvise"):  # read once: leave the cache to the rest of the machine
                    os.posix_fadvise(src, lo, hi - lo, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(src)
            view = memoryview(buf)
            for j in np.flatnonzero(b.sizes):
                n, at, k = int(b.sizes[j]), int(b.offsets[j]) - lo, int(filled[j])
                _pwrite_all(fd, view[at:at + n * cs], int(offsets[j]) + k * cs)
                _pwrite_all(fd, view[at + n * cs:at + n * (cs + ID_BYTES)], int(ids_at[j]) + k * ID_BYTES)
                filled[j] += n
            del view, buf
            if on_block is not None:
                on_block(bi)
        os.fsync(fd)
    finally:
        os.close(fd)
    return sizes


def ondisk_invlists(nlist: int, code_size: int, filename: str, sizes: np.ndarray):
    """An ``OnDiskInvertedLists`` describing a file written by :func:`write_merged_lists`, for
    ``write_index`` (it is never mapped here: ``ptr`` stays null)."""
    faiss = _faiss()
    il = faiss.OnDiskInvertedLists(nlist, code_size, filename)
    _, total = list_layout(sizes, code_size)
    il.totsize = total  # set first: set_all_lists_sizes leaves the space after the lists as a free slot
    sz = np.ascontiguousarray(sizes, dtype=np.uint64)
    il.set_all_lists_sizes(faiss.swig_ptr(sz))
    return il
