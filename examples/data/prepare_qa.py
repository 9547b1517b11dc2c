"""FlashRAG-format QA data (and GAIA's metadata.jsonl) → OpenRLHF prompt jsonl.

Each output row is ``{"prompt", "answers", "datasource", "id", "question"}``: launch with
``--data.input_key prompt --data.label_key answers``. OpenRLHF reports eval metrics per
``datasource``, so the seven benchmarks can share one test file.

The prompt text comes from agent_env's templates (the same wording the agent is trained on):
``search_r1_base`` (default) for base models; instruct models use the same text with
``--data.apply_chat_template`` (OpenRLHF then sends it as the user turn, which is exactly
Search-R1's chat prompt); ``none`` keeps the raw question for an agent that renders it itself.

    # the paper's data, online (RUC-NLPIR/FlashRAG_datasets on the hub)
    python examples/data/prepare_qa.py qa --hub --out ~/data/sgrpo
    # local FlashRAG layout DIR/<dataset>/<split>.jsonl
    python examples/data/prepare_qa.py qa --flashrag-dir ../shared/data --out OUT \\
        --train hotpotqa --train-split train_hipporag100
    # GAIA (validation metadata.jsonl from the gated gaia-benchmark/GAIA repo)
    python examples/data/prepare_qa.py gaia --metadata GAIA/2023/validation/metadata.jsonl --out OUT
    # a FlashRAG-format file of your own ({"id", "question", "golden_answers"} per line)
    python examples/data/prepare_qa.py flashrag --data mine=my_questions.jsonl --out OUT/train.jsonl --shuffle
    # Search-R1's own parquet files (its data scripts' train.parquet / test.parquet)
    python examples/data/prepare_qa.py searchr1 --parquet nq_search/train.parquet --out OUT/train.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterable
from pathlib import Path

from tqdm import tqdm

from agent_env.templates import build_prompt
from openrlhf_sgrpo.eval.gaia import load_gaia
from openrlhf_sgrpo.eval.searchr1_data import SearchR1DataError, convert_parquet
from openrlhf_sgrpo.local.data import DataError, Question, load_flashrag_jsonl

HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"
TRAIN_DATASETS = ("nq", "hotpotqa")
# The split each benchmark is evaluated on (FlashRAG / Search-R1 convention: dev where the
# test answers are hidden).
TEST_SPLITS = {
    "nq": "test", "triviaqa": "test", "popqa": "test", "hotpotqa": "dev",
    "2wikimultihopqa": "dev", "musique": "dev", "bamboogle": "test",
}
# Templates that need no tokenizer (chat rendering is OpenRLHF's --data.apply_chat_template).
TEXT_TEMPLATES = ("search_r1_base", "deep_research", "none")
INPUT_KEY, LABEL_KEY = "prompt", "answers"


def to_prompt_row(q: Question, datasource: str, template: str) -> dict:
    question = q.question.strip()
    return {INPUT_KEY: build_prompt(template, question), LABEL_KEY: list(q.golds),
            "datasource": datasource, "id": q.qid, "question": question}


def write_jsonl(rows: Iterable[dict], path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = path.with_suffix(path.suffix + ".part")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    tmp.replace(path)
    return n


class Source:
    """Where FlashRAG files come from: a local folder, or the hub (downloaded on demand)."""

    def __init__(self, flashrag_dir: Path | None, hub_cache: Path | None = None):
        self.dir, self.hub_cache = flashrag_dir, hub_cache

    def path(self, dataset: str, split: str) -> Path:
        if self.dir is not None:
            path = self.dir / dataset / f"{split}.jsonl"
            if not path.is_file():
                raise DataError(f"{path} does not exist (expected the FlashRAG layout <dir>/<dataset>/<split>.jsonl)")
            return path
        from huggingface_hub import hf_hub_download  # only when online

        return Path(hf_hub_download(HUB_REPO, f"{dataset}/{split}.jsonl", repo_type="dataset",
                                    cache_dir=str(self.hub_cache) if self.hub_cache else None))

    def rows(self, dataset: str, split: str, template: str) -> list[dict]:
        questions = load_flashrag_jsonl(self.path(dataset, split))
        return [to_prompt_row(q, dataset, template)
                for q in tqdm(questions, desc=f"{dataset}/{split}", unit=" q", leave=False)]


def parse_split_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, split = item.partition("=")
        if not sep or name not in TEST_SPLITS or not split:
            raise DataError(f"--test-split {item!r}: expected NAME=SPLIT with NAME in {sorted(TEST_SPLITS)}")
        out[name] = split
    return out


def prepare_qa(a: argparse.Namespace) -> dict[str, int]:
    """Write train.jsonl (shuffled: OpenRLHF's --data.max_samples takes the first rows),
    test.jsonl (every benchmark, in order) and test/<benchmark>.jsonl; return row counts."""
    source = Source(a.flashrag_dir, a.hub_cache)
    rng = random.Random(a.seed)
    counts: dict[str, int] = {}
    if a.train:
        train = [row for name in a.train for row in source.rows(name, a.train_split, a.template)]
        rng.shuffle(train)
        counts["train"] = write_jsonl(train, a.out / "train.jsonl")
    splits = {**TEST_SPLITS, **parse_split_overrides(a.test_split)}
    test: list[dict] = []
    for name in a.test:
        rows = source.rows(name, splits[name], a.template)
        if a.max_per_dataset and len(rows) > a.max_per_dataset:
            rows = random.Random(f"{a.seed}-{name}").sample(rows, a.max_per_dataset)
        counts[f"test/{name}"] = write_jsonl(rows, a.out / "test" / f"{name}.jsonl")
        test.extend(rows)
    if a.test:
        counts["test"] = write_jsonl(test, a.out / "test.jsonl")
    return counts


def gaia_rows(metadata: Path, template: str) -> list[dict]:
    """GAIA's metadata.jsonl → prompt rows, datasource ``gaia_level<N>`` (attached files are
    named in the question by the shared GAIA reader)."""
    questions, levels = load_gaia(metadata)
    return [to_prompt_row(q, f"gaia_level{levels[q.qid]}", template) for q in questions]


def own_rows(specs: list[str], template: str) -> list[dict]:
    """``[NAME=]PATH`` FlashRAG files → prompt rows, datasource NAME (default: the file's stem)."""
    rows = []
    for spec in specs:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        rows += [to_prompt_row(q, name or Path(path).stem, template) for q in load_flashrag_jsonl(path)]
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    qa = sub.add_parser("qa", help="FlashRAG QA datasets → train.jsonl, test.jsonl, test/<name>.jsonl")
    where = qa.add_mutually_exclusive_group(required=True)
    where.add_argument("--flashrag-dir", type=Path, help="local FlashRAG layout <dir>/<dataset>/<split>.jsonl")
    where.add_argument("--hub", action="store_true", help=f"download from the hub's {HUB_REPO} (online)")
    qa.add_argument("--hub-cache", type=Path, help="hub download cache folder")
    qa.add_argument("--out", type=Path, required=True)
    qa.add_argument("--train", type=_names, default=list(TRAIN_DATASETS), help="comma list ('' = none)")
    qa.add_argument("--train-split", default="train")
    qa.add_argument("--test", type=_names, default=list(TEST_SPLITS), help="comma list ('' = none)")
    qa.add_argument("--test-split", action="append", default=[], metavar="NAME=SPLIT",
                    help="override a benchmark's split, e.g. hotpotqa=dev_500")
    qa.add_argument("--max-per-dataset", type=int, default=0, help="sample at most N per benchmark (0 = all)")
    qa.add_argument("--template", choices=TEXT_TEMPLATES, default="search_r1_base")
    qa.add_argument("--seed", type=int, default=42)
    gaia = sub.add_parser("gaia", help="GAIA metadata.jsonl → one prompt jsonl (deep-research template)")
    gaia.add_argument("--metadata", type=Path, required=True)
    gaia.add_argument("--out", type=Path, required=True, help="output jsonl file")
    gaia.add_argument("--template", choices=TEXT_TEMPLATES, default="deep_research")
    own = sub.add_parser("flashrag", help="FlashRAG-format jsonl files of your own → one prompt jsonl")
    own.add_argument("--data", required=True, action="append", metavar="[NAME=]PATH",
                     help="a jsonl of {id, question, golden_answers}; NAME is its datasource (default: the file's "
                          "stem); repeat to merge several")
    own.add_argument("--out", type=Path, required=True, help="output jsonl file")
    own.add_argument("--template", choices=TEXT_TEMPLATES, default="search_r1_base")
    own.add_argument("--shuffle", action="store_true",
                     help="shuffle the rows (--seed): OpenRLHF's --data.max_samples takes the first ones")
    own.add_argument("--seed", type=int, default=42)
    sr1 = sub.add_parser("searchr1", help="Search-R1's parquet (train.parquet, test.parquet) → one prompt jsonl")
    sr1.add_argument("--parquet", type=Path, required=True, action="append",
                     help="a Search-R1 parquet file (repeat to merge several into one output)")
    sr1.add_argument("--out", type=Path, required=True, help="output jsonl file")
    sr1.add_argument("--template", choices=TEXT_TEMPLATES, default="search_r1_base")
    sr1.add_argument("--shuffle", action="store_true",
                     help="shuffle the rows (--seed): OpenRLHF's --data.max_samples takes the first ones")
    sr1.add_argument("--seed", type=int, default=42)
    return p


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in TEST_SPLITS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown dataset(s) {unknown}; known: {sorted(TEST_SPLITS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.command == "qa":
            counts = prepare_qa(a)
        elif a.command in ("searchr1", "flashrag"):
            rows = ([row for path in a.parquet for row in convert_parquet(path, a.template)]
                    if a.command == "searchr1" else own_rows(a.data, a.template))
            if a.shuffle:
                random.Random(a.seed).shuffle(rows)
            counts = {str(a.out): write_jsonl(rows, a.out)}
        else:
            counts = {str(a.out): write_jsonl(gaia_rows(a.metadata, a.template), a.out)}
    except (DataError, SearchR1DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, n in counts.items():
        print(f"{name}: {n} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
