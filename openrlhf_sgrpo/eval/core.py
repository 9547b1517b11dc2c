"""Run questions through the agent greedily, append one JSON line per question, skip finished ids.

Up to ``concurrency`` questions are in flight at once (the engine batches their turns, the tool
clients batch their calls), and a new one starts as soon as one ends, so no batch waits for its
slowest question. Each answered question is appended to ``predictions.jsonl`` (and flushed) as
it ends, so an interrupted evaluation resumes where it stopped, losing at most the questions in
flight. With ``records`` each trajectory is also appended as a rollout record for
``python -m openrlhf_sgrpo.inspect``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from agent_env import info_keys as K
from agent_env.actions import answer_of
from openrlhf_sgrpo.local.data import Question
from openrlhf_sgrpo.local.experience import Sample
from openrlhf_sgrpo.local.rollout import AgentRollout
from openrlhf_sgrpo.rollout_records.sources import records_from_samples
from openrlhf_sgrpo.rollout_records.store import RolloutWriter


def final_answer(sample: Sample, tokenizer) -> str | None:
    """The ``<answer>`` of the last turn by the episode's own rule (None when the agent never answered)."""
    k, last = 0, None
    while K.turn_start_key(k) in sample.info:
        start, end = int(sample.info[K.turn_start_key(k)]), int(sample.info[K.turn_end_key(k)])
        if start >= 0:
            last = (start, end)
        k += 1
    if last is None:
        return None
    return answer_of(tokenizer.decode(sample.sequences[last[0]: last[1]].tolist(), skip_special_tokens=True))


def record_of(dataset: str, q: Question, sample: Sample, tokenizer) -> dict:
    info = sample.info
    return {
        "dataset": dataset, "id": q.qid, "question": q.question, "golden_answers": q.golds,
        "prediction": final_answer(sample, tokenizer), "score": sample.score,
        "em": info.get(K.EM, 0.0), "f1": info.get(K.F1, 0.0),
        "search_calls": info.get(K.SEARCH_CALLS, 0.0), "code_calls": info.get(K.CODE_CALLS, 0.0),
        "tool_calls": info.get(K.TOOL_CALLS, 0.0), "turns": info.get(K.TURNS, 0.0),
        "answered": info.get(K.ANSWERED, 0.0), "truncated": sample.truncated,
    }


def read_records(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass(frozen=True)
class TrajectoryRecords:
    """Where an evaluation also appends each question's trajectory as a rollout record (the
    inspector's input): ``run_dir/rollouts/<phase>/step_<step>.jsonl``, one group of n=1 each."""

    run_dir: Path
    phase: str = "eval"
    step: int = 0


def evaluate(rollout: AgentRollout, dataset: str, questions: list[Question], predictions: str | Path,
             concurrency: int = 16, progress: bool = True, records: TrajectoryRecords | None = None) -> list[dict]:
    """Evaluate ``questions`` (skipping ids already in ``predictions``); return this dataset's records."""
    predictions = Path(predictions)
    predictions.parent.mkdir(parents=True, exist_ok=True)
    done = {r["id"] for r in read_records(predictions) if r.get("dataset") == dataset}
    todo = [q for q in questions if q.qid not in done]
    writer = RolloutWriter(records.run_dir) if records is not None else None
    position = {q.qid: i for i, q in enumerate(questions)}
    with open(predictions, "a", encoding="utf-8") as f:
        def write(i: int, sample: Sample) -> None:
            f.write(json.dumps(record_of(dataset, todo[i], sample, rollout.tokenizer)) + "\n")
            f.flush()
            if writer is not None:  # after the prediction, the run's result: a crash between loses a record only
                # questions finish in any order: the record's group is the question's place in its dataset
                writer.append(records.phase, records.step, records_from_samples(
                    [sample], rollout.tokenizer, 1, phase=records.phase, step=records.step,
                    prompt_ids=[todo[i].qid], dataset=dataset, group_offset=position[todo[i].qid]))

        rollout.run_each([q.question for q in todo], [q.golds for q in todo], concurrency, write, greedy=True,
                         desc=f"eval {dataset}", progress=progress, done_before=len(questions) - len(todo))
    wanted = {q.qid for q in questions}
    return [r for r in read_records(predictions) if r.get("dataset") == dataset and r["id"] in wanted]


def summarize(records: list[dict]) -> dict[str, float]:
    """Mean EM / F1 / score / search calls over records (NaN-free: empty → zeros)."""
    n = len(records)
    mean = (lambda key: sum(float(r.get(key) or 0.0) for r in records) / n) if n else (lambda key: 0.0)
    return {"n": n, "em": mean("em"), "f1": mean("f1"), "score": mean("score"),
            "search_calls": mean("search_calls"), "tool_calls": mean("tool_calls"), "answered": mean("answered")}
