"""Prompt templates: Search-R1's base prompt (the paper's anchors use this wording), a chat
variant for instruct models, and a deep-research prompt with search and code (GAIA style)."""

from __future__ import annotations

SEARCH_R1_INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> "
    "and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
)

DEEP_RESEARCH_INSTRUCTION = (
    "You are a research assistant. Solve the task step by step. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "To look something up on the web, write <search> query </search>; the results come back between "
    "<information> and </information>. "
    "To compute or process data, write Python code between <code> and </code>; its printed output comes "
    "back between <result> and </result>. "
    "You may search and run code as many times as you need. "
    "When you are done, give only the final answer inside <answer> and </answer>. "
    "The final answer should be a number OR as few words as possible OR a comma separated list of numbers "
    "and/or strings. Do not use commas or units (such as $ or %) in numbers unless asked; do not use "
    "articles or abbreviations in strings. "
)


def search_r1_base(question: str) -> str:
    """Search-R1's base-model prompt, verbatim wording."""
    return f"{SEARCH_R1_INSTRUCTION}Question: {question.strip()}\n"


def _chat(instruction: str, question: str, tokenizer) -> str:
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("the chat templates need a tokenizer with a chat_template")
    messages = [{"role": "user", "content": f"{instruction}Question: {question.strip()}\n"}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def search_r1_chat(question: str, tokenizer) -> str:
    """Search-R1's instruction as a user turn, rendered with the tokenizer's chat template."""
    return _chat(SEARCH_R1_INSTRUCTION, question, tokenizer)


def deep_research(question: str, tokenizer=None) -> str:
    """Search + code prompt; chat-rendered when the tokenizer has a template."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return _chat(DEEP_RESEARCH_INSTRUCTION, question, tokenizer)
    return f"{DEEP_RESEARCH_INSTRUCTION}Question: {question.strip()}\n"


def build_prompt(template: str, question: str, tokenizer=None) -> str:
    """Render `question` with the named template ('none' passes the prompt through)."""
    if template == "search_r1_base":
        return search_r1_base(question)
    if template == "search_r1_chat":
        return search_r1_chat(question, tokenizer)
    if template == "deep_research":
        return deep_research(question, tokenizer)
    if template == "none":
        return question
    raise ValueError(f"unknown template {template!r}")
