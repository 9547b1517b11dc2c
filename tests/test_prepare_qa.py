"""examples/data/prepare_qa.py on the real FlashRAG samples in ../shared/data; the output must
load through OpenRLHF's own blending_datasets + PromptDataset, the way training reads it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent_env.templates import SEARCH_R1_INSTRUCTION, search_r1_base
from openrlhf_sgrpo.assets import load_qwen2_tokenizer, shared_data

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "examples" / "data" / "prepare_qa.py"
BENCHMARKS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


def prepare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def qwen2_tokenizer():
    """Loaded once: building it from the GGUF vocabulary takes ~10 s."""
    return load_qwen2_tokenizer()


@pytest.fixture(scope="module")
def flashrag_dir() -> Path:
    d = shared_data()
    if not (d / "bamboogle" / "test.jsonl").is_file():
        pytest.skip(f"../shared/data absent: {d} has no FlashRAG benchmark files")
    return d


@pytest.fixture(scope="module")
def prepared(flashrag_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qa")
    proc = prepare("qa", "--flashrag-dir", str(flashrag_dir), "--out", str(out), "--train", "hotpotqa,musique",
                   "--train-split", "train_hipporag100", "--max-per-dataset", "50")
    assert proc.returncode == 0, proc.stderr
    return out


class _Strategy:
    """The two things PromptDataset / blending_datasets read from OpenRLHF's strategy."""

    def __init__(self, **data):
        self.args = SimpleNamespace(data=SimpleNamespace(**data), use_ms=False)

    def print(self, *_):
        pass

    def is_rank_0(self) -> bool:
        return True


def load_with_openrlhf(path: Path, tokenizer, apply_chat_template: bool = False, input_key: str = "prompt"):
    from openrlhf.datasets import PromptDataset
    from openrlhf.datasets.utils import blending_datasets

    strategy = _Strategy(input_key=input_key, label_key="answers", apply_chat_template=apply_chat_template)
    data = blending_datasets(str(path), None, strategy, 42, dataset_split="train")
    return PromptDataset(data, tokenizer, strategy)


@pytest.mark.shared_data
def test_splits_counts_and_rows(prepared, flashrag_dir):
    train = read_jsonl(prepared / "train.jsonl")
    assert len(train) == 200 and {r["datasource"] for r in train} == {"hotpotqa", "musique"}
    # shuffled: OpenRLHF's --data.max_samples takes the first rows, which must mix both sets
    assert {r["datasource"] for r in train[:20]} == {"hotpotqa", "musique"}
    test = read_jsonl(prepared / "test.jsonl")
    per = {name: read_jsonl(prepared / "test" / f"{name}.jsonl") for name in BENCHMARKS}
    assert all(len(per[n]) == 50 for n in BENCHMARKS)
    assert len(test) == sum(len(v) for v in per.values())
    source = {json.loads(line)["id"]: json.loads(line) for line in
              (flashrag_dir / "hotpotqa" / "dev.jsonl").read_text().splitlines()}
    for row in per["hotpotqa"]:
        orig = source[row["id"]]
        assert row["answers"] == orig["golden_answers"] and row["question"] == orig["question"].strip()
        assert row["prompt"] == search_r1_base(orig["question"])


@pytest.mark.slow
@pytest.mark.shared_data
@pytest.mark.parametrize("chat", [False, True], ids=["base", "chat"])
def test_output_loads_with_openrlhf_prompt_dataset(prepared, openrlhf_gpu_stubs, qwen2_tokenizer, chat):
    tok = qwen2_tokenizer
    ds = load_with_openrlhf(prepared / "test.jsonl", tok, apply_chat_template=chat)
    rows = read_jsonl(prepared / "test.jsonl")
    assert len(ds) == len(rows)
    datasource, prompt, label, _ = ds[0]
    assert datasource == rows[0]["datasource"] and label == rows[0]["answers"]
    if chat:  # Search-R1's chat prompt: the instruction + question as the user turn
        assert prompt.startswith("<|im_start|>") and prompt.endswith("<|im_start|>assistant\n")
        assert SEARCH_R1_INSTRUCTION in prompt and rows[0]["question"] in prompt
    else:
        assert prompt == rows[0]["prompt"]
    assert len(tok(prompt)["input_ids"]) < 512  # fits the launch scripts' prompt budget


@pytest.mark.slow
def test_gaia_metadata(tmp_path, openrlhf_gpu_stubs, qwen2_tokenizer):
    # A fixture in GAIA's metadata.jsonl format (GAIA itself must not be redistributed).
    meta = tmp_path / "2023" / "validation" / "metadata.jsonl"
    meta.parent.mkdir(parents=True)
    tasks = [
        {"task_id": "t1", "Question": "How many legs does a spider have?", "Level": 1, "Final answer": "8",
         "file_name": "", "Annotator Metadata": {"Steps": "..."}},
        {"task_id": "t2", "Question": "Sum column B of the attached sheet.", "Level": 2, "Final answer": "42",
         "file_name": "t2.xlsx"},
    ]
    meta.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    out = tmp_path / "gaia.jsonl"
    proc = prepare("gaia", "--metadata", str(meta), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = read_jsonl(out)
    assert [r["datasource"] for r in rows] == ["gaia_level1", "gaia_level2"]
    assert rows[1]["answers"] == ["42"] and f"Attached file: {(meta.parent / 't2.xlsx').resolve()}" in rows[1]["question"]
    assert "<code>" in rows[0]["prompt"] and rows[0]["prompt"].endswith("Question: How many legs does a spider have?\n")
    ds = load_with_openrlhf(out, qwen2_tokenizer, input_key="question")
    assert ds[0][1] == tasks[0]["Question"] and ds[0][2] == ["8"]


@pytest.mark.shared_data
def test_missing_split_is_named(flashrag_dir, tmp_path):
    proc = prepare("qa", "--flashrag-dir", str(flashrag_dir), "--out", str(tmp_path), "--train", "nq", "--test", "")
    assert proc.returncode == 2
    assert f"{flashrag_dir / 'nq' / 'train.jsonl'} does not exist" in proc.stderr


def test_bad_rows_and_names_are_reported(tmp_path):
    bad = tmp_path / "flashrag" / "bamboogle" / "test.jsonl"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"id": "1", "question": "q?", "golden_answers": ["a"]}\n{"id": "2", "question": "q2"}\n')
    proc = prepare("qa", "--flashrag-dir", str(tmp_path / "flashrag"), "--out", str(tmp_path / "o"),
                   "--train", "", "--test", "bamboogle")
    assert proc.returncode == 2 and f"{bad}:2: missing ['golden_answers']" in proc.stderr
    assert not (tmp_path / "o" / "test.jsonl").exists()
    proc = prepare("qa", "--flashrag-dir", str(tmp_path), "--out", str(tmp_path / "o"), "--test", "nqq")
    assert proc.returncode == 2 and "unknown dataset(s) ['nqq']" in proc.stderr
