"""Observation text fed back to the policy after a tool call (Search-R1's exact layout)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

Truncator = Callable[[str], str]


@dataclass(frozen=True)
class Doc:
    """One retrieved passage: its corpus id, title and body."""

    id: str
    title: str
    text: str


def doc_from_contents(doc_id: str, contents: str) -> Doc:
    """wiki-18 `contents` is '"Title"\\nbody': the title is the first line without its quotes."""
    first, _, rest = contents.partition("\n")
    return Doc(str(doc_id), first.strip().strip('"'), rest.strip())


def format_docs(docs: list[Doc]) -> str:
    return "".join(f"Doc {i + 1}(Title: {d.title}) {d.text}\n" for i, d in enumerate(docs))


def information_block(body: str, truncate: Truncator) -> str:
    return f"\n\n<information>{truncate(body.strip())}</information>\n\n"


def result_block(output: str, truncate: Truncator) -> str:
    return f"\n\n<result>{truncate(output)}</result>\n\n"


def token_truncator(tokenizer, max_tokens: int) -> Truncator:
    """Cut text to `max_tokens` tokens of the policy's tokenizer (no special tokens added)."""

    def cut(text: str) -> str:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= max_tokens:
            return text
        return tokenizer.decode(ids[:max_tokens], skip_special_tokens=False)

    return cut


def char_truncator(max_tokens: int, chars_per_token: int = 4) -> Truncator:
    """Fallback when no tokenizer is known: roughly `max_tokens` tokens' worth of characters."""
    limit = max_tokens * chars_per_token
    return lambda text: text[:limit]
