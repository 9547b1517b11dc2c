"""Measured properties of the search task: retrieval recall per hop and a closed-book baseline.

The task is only worth training on if (1) searching can answer it: each hop's gold passage must
come back for the query a policy can write (the entity name, copied from the question or from
the first observation), and (2) nothing else can: a policy that does not search, whatever it
memorised, must fail. (1) is measured against the running retriever (the demo's own encoder and
index, over HTTP, as the agent calls it); (2) by making the policy answer at once (its own prompt, then
``<answer>`` written for it: a no-search policy with the policy's memory), and by checking that no
held-out answer occurs in anything the training side holds.
"""

from __future__ import annotations

import json
import re
import urllib.request
from dataclasses import dataclass

from agent_env.rewards import exact_match, token_f1
from openrlhf_sgrpo.demo.synth_task import SynthTask, TaskQuestion
from retriever_server.corpora import split_contents

FORCED_ANSWER = "<answer> "


def retrieve_titles(retriever_url: str, queries: list[str], topk: int = 3, batch: int = 64) -> list[list[str]]:
    """Top-``topk`` passage titles per query from a running ``/retrieve`` (Search-R1's wire format)."""
    out: list[list[str]] = []
    for lo in range(0, len(queries), batch):
        body = json.dumps({"queries": queries[lo: lo + batch], "topk": topk, "return_scores": False}).encode()
        req = urllib.request.Request(retriever_url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            result = json.loads(resp.read())["result"]
        out += [[split_contents(d["contents"])[0] for d in docs] for docs in result]
    return out


@dataclass(frozen=True)
class Recall:
    """Shares of held-out questions (``n`` per hop) whose passages the retriever returns in the top k."""

    k: int
    hop1: float  # the first hop's passage, for its natural query (the entity named in the question)
    hop2: float  # the second hop's passage, for its natural query (the bridge entity)
    question_as_query: float  # the first hop's passage when the whole question is the query
    two_hop_in_one_search: float  # the second hop's passage among either one-search query's top k
    n_one_hop: int
    n_two_hop: int

    def describe(self) -> str:
        return (f"retrieval recall@{self.k} (held-out, natural queries): hop 1 {self.hop1:.3f}, hop 2 "
                f"{self.hop2:.3f}; whole question as the query: hop 1 {self.question_as_query:.3f}; two-hop "
                f"answer passage reached by one search: {self.two_hop_in_one_search:.3f} "
                f"({self.n_one_hop} one-hop + {self.n_two_hop} two-hop questions)")


def measure_recall(retriever_url: str, questions: list[TaskQuestion], k: int = 3) -> Recall:
    """Recall of every hop's gold passage among the top ``k`` for its natural query."""
    def share(hits: list[bool]) -> float:
        return sum(hits) / len(hits) if hits else float("nan")

    first = retrieve_titles(retriever_url, [q.hops[0].query for q in questions], k)
    whole = retrieve_titles(retriever_url, [q.question for q in questions], k)
    two = [i for i, q in enumerate(questions) if q.n_hops == 2]
    second = retrieve_titles(retriever_url, [questions[i].hops[1].query for i in two], k)
    hop1 = share([q.hops[0].title in titles for q, titles in zip(questions, first)])
    hop2 = share([questions[i].hops[1].title in titles for i, titles in zip(two, second)])
    as_query = share([q.hops[0].title in titles for q, titles in zip(questions, whole)])
    one_search = share([questions[i].hops[1].title in first[i] + whole[i] for i in two])
    return Recall(k, hop1, hop2, as_query, one_search, len(questions) - len(two), len(two))


def leaked_answers(task: SynthTask) -> list[str]:
    """Held-out answers that occur in a training question or answer (must be none: a policy could
    then answer a held-out question from what it was trained on)."""
    seen = " ".join(f"{q.question} {q.answer}" for q in task.train)
    return [q.answer for q in task.heldout if mentions(seen, q.answer)]


def mentions(text: str, name: str) -> bool:
    """Whether ``text`` holds ``name`` as whole words (``Fedren`` is not in ``Fedrenholm``)."""
    return re.search(rf"\b{re.escape(name)}\b", text, re.IGNORECASE) is not None


def closed_book_answers(model, tokenizer, prompts: list[str], batch_size: int = 16,
                        max_new_tokens: int = 16) -> list[str]:
    """Greedy answers with no search: each prompt (the agent's own, as rendered for the policy) is
    followed by ``<answer>`` written for the policy, which must then name the answer at once."""
    import torch

    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    device = next(model.parameters()).device
    answers: list[str] = []
    try:
        for lo in range(0, len(prompts), batch_size):
            texts = [f"{p}{FORCED_ANSWER}" for p in prompts[lo: lo + batch_size]]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
            for row in out[:, enc["input_ids"].shape[1]:]:
                text = tokenizer.decode(row, skip_special_tokens=True)
                answers.append(text.split("</answer>")[0].strip())  # what it wrote before closing the tag
    finally:
        tokenizer.padding_side = side
    return answers


def closed_book(model, tokenizer, questions: list[TaskQuestion], prompt_fn) -> dict:
    """EM and F1 of :func:`closed_book_answers` (what the policy's memory alone scores)."""
    preds = closed_book_answers(model, tokenizer, [prompt_fn(q.question) for q in questions])
    n = max(1, len(questions))
    return {"n": len(questions), "em": sum(exact_match(p, [q.answer]) for p, q in zip(preds, questions)) / n,
            "f1": sum(token_f1(p, [q.answer]) for p, q in zip(preds, questions)) / n,
            "examples": [[q.question, q.answer, p] for q, p in list(zip(questions, preds))[:3]]}
