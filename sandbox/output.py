"""Bounded capture of a program's stdout/stderr.

A flood (`while True: print(...)`) must neither fill the service's memory nor stall the child on
a full pipe, so we keep the first `limit` bytes of each stream, keep draining the rest, and count
what was dropped for the truncation marker.
"""

from __future__ import annotations

from .api import TRUNCATION_MARKER


class CappedBuffer:
    """Keeps the first `limit` bytes written and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chunks: list[bytes] = []
        self._kept = 0
        self.dropped = 0

    def write(self, data: bytes) -> None:
        room = self.limit - self._kept
        if room > 0:
            piece = data[:room]
            self._chunks.append(piece)
            self._kept += len(piece)
        self.dropped += max(0, len(data) - max(room, 0))

    def kept(self) -> bytes:
        return b"".join(self._chunks)

    def text(self) -> str:
        out = self.kept().decode("utf-8", errors="replace")
        if self.dropped:
            out += TRUNCATION_MARKER.format(dropped=self.dropped)
        return out
