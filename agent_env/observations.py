"""Observation text fed back to the policy after a tool call, byte-identical to Search-R1's.

Search-R1 (`search_r1/llm_agent/generation.py`) renders a search as
`\n\n<information>{_passages2string(result).strip()}</information>\n\n`, where each passage is
`Doc {i}(Title: {first line of contents}) {the other lines, joined by "\n"}\n`. A policy trained
there sees the same bytes here. One deliberate difference: our per-observation token cap cuts the
text *inside* the tags (the closing tag always survives), where Search-R1 cuts the tokenized
observation as a whole (docs/agent_env.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Truncator = Callable[[str], str]


@dataclass(frozen=True)
class Doc:
    """One retrieved passage: its corpus id, title and body."""

    id: str
    title: str
    text: str


def doc_from_contents(doc_id: str, contents: str) -> Doc:
    """wiki-18 `contents` is '"Title"\\nbody': Search-R1 takes the first line *verbatim* as the title
    (quotes kept: `Doc 1(Title: "Demon Dice") ...`) and the remaining lines, unstripped, as the text."""
    first, _, rest = contents.partition("\n")
    return Doc(str(doc_id), first, rest)


def format_docs(docs: list[Doc]) -> str:
    """Search-R1's `_passages2string`: one `Doc i(Title: t) text` line per passage."""
    return "".join(f"Doc {i + 1}(Title: {d.title}) {d.text}\n" for i, d in enumerate(docs))


def information_block(body: str, truncate: Truncator) -> str:
    """Search-R1's search observation: two newlines each side of the tags, the body stripped."""
    return f"\n\n<information>{truncate(body.strip())}</information>\n\n"


def result_block(output: str, truncate: Truncator) -> str:
    """A code run's output, wrapped like a search observation (not stripped: whitespace can matter)."""
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
