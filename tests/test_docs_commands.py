"""The docs' commands run (issue #57, item 9): every fenced shell command of README.md, and of the
quick starts of docs/deploy.md, docs/multinode.md, docs/study.md and docs/retriever.md, is either
run here in a cheap form from a fresh shell (no activated venv, no PYTHON, HOME a temporary
folder so that every ``~/data/...`` lands in it), run by another named test, or listed with the
reason it cannot run here (a GPU, a hub download, a cluster). A command that is none of these
fails :func:`test_every_fenced_command_is_run_or_says_why_not`: add it to ``COMMANDS`` (or
``FAMILIES``) when you add it to a page.

Cheap forms: ``DRY_RUN=1`` for the launch scripts (OpenRLHF's real parser, no Ray), the data
scripts on a tiny FlashRAG layout and a tiny Search-R1-style pair (21 Wikipedia extracts, MiniLM
vectors in an IndexFlatIP), and ``--help`` for a synopsis (every ``--flag`` it names must be in
the help). The one ``make demo`` run is tests/test_demo_unprivileged.py's, as a user without root.
Fences must name their language: ``bash`` for commands, ``text`` (or another) for the rest.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# page -> how many leading `## ` sections form its quick start (None: the whole page)
PAGES: dict[str, int | None] = {"README.md": None, "docs/deploy.md": 1, "docs/multinode.md": 1,
                                "docs/study.md": 1, "docs/retriever.md": 2}
SHELL_LANGS = {"bash", "sh", "shell", "console"}
FRESH_PATH = "/usr/local/bin:/usr/bin:/bin"
RUN_TIMEOUT_S = 900  # OpenRLHF's parser imports torch: seconds alone, minutes on two busy cores


@dataclass(frozen=True)
class Run:
    """Run here: ``cheap`` is bash from a fresh shell in the checkout ({home}, {tiny}, {minilm})."""

    cheap: str
    why: str  # how the cheap form differs from the page's command
    expect: str = ""  # a substring of its output
    phase: int = 1  # 0: writes data that phase-1 commands read


@dataclass(frozen=True)
class Help:
    """A synopsis: the module's ``--help`` runs, and names every ``--flag`` the page's command uses."""

    why: str


@dataclass(frozen=True)
class ByTest:
    """Run by another test (``tests/file.py::test_name``), which must exist."""

    test: str
    why: str


@dataclass(frozen=True)
class NotHere:
    reason: str


Entry = Run | Help | ByTest | NotHere
TRAIN = "examples/qwen2.5-3b/train_sgrpo_base.sh"
# One dry run serves the README's and deploy.md's lines (a dry run does not read DATA_DIR).
TRAIN_DRY = f"DRY_RUN=1 SAVE_PATH=~/runs/dry DATA_DIR=~/data/sgrpo RETRIEVER_URL=http://tools-host:8000/retrieve {TRAIN}"
COMMANDS: dict[str, Entry] = {
    # README.md: the two commands
    "make demo": ByTest("tests/test_demo_unprivileged.py::test_make_demo_smoke_as_a_user_without_root",
                        "make demo DEMO_ARGS=--smoke, from a fresh environment, as a user without root"),
    "make test": Run("make -n test", "the suite cannot run inside itself: make's plan for it", "pytest"),
    # README.md and docs/deploy.md: the cluster quick start
    "pip install -r requirements-gpu.txt && pip install --no-deps -e .":
        NotHere("CUDA wheels from PyPI (vLLM, flash-attn, faiss-gpu); tests/test_train_image.py builds the "
                "image's CPU set offline"),
    "python examples/data/prepare_qa.py qa --hub --out ~/data/sgrpo":
        Run(".venv/bin/python examples/data/prepare_qa.py qa --flashrag-dir {tiny}/flashrag --out ~/data/sgrpo",
            "the hub download: the same command on a tiny FlashRAG layout", "test: ", phase=0),
    "python examples/data/prepare_qa.py qa --flashrag-dir /data/flashrag --out ~/data/sgrpo":
        Run(".venv/bin/python examples/data/prepare_qa.py qa --flashrag-dir {tiny}/flashrag --out ~/data/sgrpo",
            "a tiny FlashRAG layout", "train: ", phase=0),
    "PREBUILT=1 INDEX_TYPE=ivf_pqfs_sq8 examples/data/prepare_wiki.sh":
        Run("PREBUILT=1 INDEX_TYPE=flat CORPUS={tiny}/corpus.jsonl FLAT_INDEX={tiny}/e5_Flat.index MODEL={minilm} "
            "examples/data/prepare_wiki.sh",
            "not the 79 GB download: the same route on a 21-row Search-R1-style pair, flat (hard link); the "
            "streamed kinds' import: tests/test_retriever_scale.py", '"count": 21', phase=0),
    "examples/data/prepare_wiki.sh":
        Run("CORPUS={tiny}/corpus.jsonl OUT=~/data/wiki-built MODEL={minilm} examples/data/prepare_wiki.sh",
            "a 21-passage corpus you have instead of the 14 GB download, MiniLM instead of E5", '"count": 21'),
    "INDEX_DIR=~/data/wiki18/e5-index docker compose up -d":
        ByTest("tests/test_compose.py::test_retrieve_through_the_stack_finds_each_article",
               "Docker: the stack up on CI's offline engine, over an index made by prepare_wiki.sh's PREBUILT route"),
    "ray start --head": NotHere("a Ray head that outlives the test; tests/test_cluster_ray.py starts Ray itself"),
    f"DATA_DIR=~/data/sgrpo RETRIEVER_URL=http://tools-host:8000/retrieve {TRAIN}":
        Run(TRAIN_DRY, "8 GPUs: DRY_RUN=1, the paper's settings through OpenRLHF's parser",
            '"estimator": "stratified_grpo"'),
    "MODEL=runs/sgrpo-qwen2.5-3b-base/model DATA_DIR=~/data/sgrpo RETRIEVER_URL=http://tools-host:8000/retrieve "
    "examples/eval/eval_qa.sh":
        Run("DRY_RUN=1 OUT=~/eval MODEL=runs/sgrpo-qwen2.5-3b-base/model DATA_DIR=~/data/sgrpo "
            "RETRIEVER_URL=http://tools-host:8000/retrieve examples/eval/eval_qa.sh",
            "no trained model here: DRY_RUN=1 checks the data and prints the settings", '"datasets"'),
    "python -m openrlhf_sgrpo.cli.train_ppo_ray <every OpenRLHF flag, unchanged> --train.agent_func_path "
    "$(python -c 'import agent_env.openrlhf_agent as m; print(m.__file__)') --algo.advantage.estimator "
    "stratified_grpo --algo.advantage.sgrpo_alpha 0.6 --algo.advantage.stratify_by tool_calls":
        Run(".venv/bin/python -m openrlhf_sgrpo.cli.train_ppo_ray --actor.model_name_or_path Qwen/Qwen2.5-3B "
            "--rollout.n_samples_per_prompt 8 --train.agent_func_path "
            "$(.venv/bin/python -c 'import agent_env.openrlhf_agent as m; print(m.__file__)') "
            "--algo.advantage.estimator stratified_grpo --algo.advantage.sgrpo_alpha 0.6 "
            "--algo.advantage.stratify_by tool_calls --dry_run",
            "the placeholder as the two flags our estimators need, --dry_run (no Ray, no GPU)", '"sgrpo_alpha": 0.6'),
    # docs/deploy.md's step 4 (the other scripts' dry runs: tests/test_examples_launch.py)
    "examples/qwen2.5-3b/train_sgrpo_instruct.sh":
        ByTest("tests/test_examples_launch.py::test_sgrpo_instruct_paper_settings", "DRY_RUN=1 of it"),
    "examples/qwen2.5-3b/train_grpo_base.sh":
        ByTest("tests/test_examples_launch.py::test_grpo_baseline_differs_only_in_estimator", "DRY_RUN=1 of it"),
    f"DRY_RUN=1 {TRAIN}": Run(TRAIN_DRY, "as written (the run folder in HOME)", '"estimator": "stratified_grpo"'),
    # README.md: your own data
    ".venv/bin/python examples/data/prepare_qa.py flashrag --data mine=my_questions.jsonl --out "
    "~/data/mine/train.jsonl --shuffle":
        Run("cd ~ && {repo}/.venv/bin/python {repo}/examples/data/prepare_qa.py flashrag --data mine=my_questions.jsonl "
            "--out ~/data/mine/train.jsonl --shuffle", "my_questions.jsonl: two FlashRAG rows", "train.jsonl: 2 rows"),
    ".venv/bin/python examples/data/prepare_qa.py searchr1 --parquet nq_hotpotqa_train/train.parquet --out "
    "~/data/mine/train.jsonl":
        Run("cd ~ && {repo}/.venv/bin/python {repo}/examples/data/prepare_qa.py searchr1 --parquet "
            "nq_hotpotqa_train/train.parquet --out ~/data/mine/train.jsonl",
            "train.parquet: three rows in Search-R1's layout", "train.jsonl: 3 rows"),
    # docs/multinode.md
    "ray start --head --port=6379 --dashboard-host=0.0.0.0 --num-gpus=8":
        NotHere("a GPU node; tests/test_multinode_docker.py starts a two-node Ray cluster in containers"),
    "ray start --address=HEAD_IP:6379 --num-gpus=8":
        NotHere("a second GPU node; tests/test_multinode_docker.py joins one in a container"),
    "ray status": NotHere("needs the cluster above"),
    "RAY_ADDRESS=http://HEAD_IP:8265 NUM_NODES=2 GPUS_PER_NODE=8 SAVE_PATH=/shared/runs/sgrpo-3b "
    "DATA_DIR=/shared/data/sgrpo RETRIEVER_URL=http://tools-host:8000/retrieve examples/qwen2.5-3b/train_sgrpo_base.sh":
        ByTest("tests/test_examples_launch.py::test_multinode_scales_placement_and_uses_one_shared_retriever",
               "DRY_RUN=1 with NUM_NODES=2 and a shared retriever"),
}
# Families of commands, matched by pattern (a synopsis, the study's GPU runs whatever their flags).
STUDY = r"^(nice -n \d+ )?(\S+=\S+ )*(\.venv/bin/)?python3? examples/study/sgrpo_vs_grpo\.py "
FAMILIES: list[tuple[re.Pattern[str], Entry]] = [
    (re.compile(r"^(\.venv/bin/)?python3? -m openrlhf_sgrpo\.ask "),
     ByTest("tests/test_ask.py::test_ask_prints_the_search_and_what_the_retriever_answered",
            "needs a trained model: a fitted tiny policy there, --corpus and an engine of its own")),
    (re.compile(r"^(\.venv/bin/)?python3? -m retriever_server\.(build_index|import_index|serve) "),
     Help("a synopsis over wiki-18 (21M passages): the CLI's --help names each flag; tests/test_retriever_*.py "
          "run the CLIs")),
    (re.compile(STUDY + r"(?=.*--device cuda)(?!.*--smoke)"),
     NotHere("needs a GPU: three arms over several seeds, one process per seed and arm")),
    (re.compile(STUDY + r"(?=.*--cpu )(?!.*--smoke)"),
     NotHere("hours of CPU per seed (3 arms x 20 steps of 32 trajectories); the script itself runs in "
             "tests/test_study.py (--smoke)")),
    (re.compile(STUDY + r".*--smoke"),
     ByTest("tests/test_study.py::test_study_runs_processes_side_by_side_survives_a_failed_one_and_writes_seed_folders",
            "the study script's --smoke")),
    (re.compile(r"^(\S+=\S+ )*(bash )?scripts/gpu_vllm_(run|pieces)\.sh\b"),
     NotHere("needs a GPU (a lent GPU machine; its CPU rehearsal is tests/test_gpu_rehearsal.py)")),
    (re.compile(r"^(\.venv/bin/)?python3? -m openrlhf_sgrpo\.demo\.study_report "),
     ByTest("tests/test_study_report.py::test_report_table_warm_up_row_repeated_seeds_and_step_times_per_session",
            "the report over seed folders")),
]


# ------------------------------------------------------------------ reading the pages
FENCE_OPEN = re.compile(r"^\s*(```|~~~)(.*)$")


def quick_start(text: str, sections: int | None) -> str:
    """The page up to the end of its first ``sections`` ``## `` sections (all of it for None)."""
    if sections is None:
        return text
    out, in_fence, seen = [], False, 0
    for line in text.split("\n"):
        if FENCE_OPEN.match(line):
            in_fence = not in_fence
        if not in_fence and line.startswith("## "):
            seen += 1
            if seen > sections:
                break
        out.append(line)
    return "\n".join(out)


def fences(text: str) -> list[tuple[int, str, list[str]]]:
    """(line number, language, body lines) of every fenced block."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        close = re.compile(r"^\s*" + re.escape(m.group(1)) + r"\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        out.append((i + 1, m.group(2).strip(), lines[i + 1:j]))
        i = j + 1
    return out


def strip_comment(line: str) -> str:
    """The line without a shell comment (a ``#`` after blank space, outside quotes)."""
    quote = None
    for k, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k]
    return line


def commands_of(body: list[str]) -> list[str]:
    """Logical commands: continuation lines joined, comments dropped, blank space collapsed."""
    out, cur = [], ""
    for raw in body:
        line = strip_comment(raw).rstrip()
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cmd = " ".join((cur + line).split())
        cur = ""
        if cmd:
            out.append(cmd)
    return out


def page_commands(root: Path = ROOT, pages: dict[str, int | None] = PAGES) -> tuple[list[tuple[str, str]], list[str]]:
    """([(where, command)], [untagged fences]) over the pages' quick starts."""
    found, untagged = [], []
    for page, sections in pages.items():
        path = root / page
        if not path.is_file():
            continue
        for line, lang, body in fences(quick_start(path.read_text(), sections)):
            if not lang:
                untagged.append(f"{page}:{line}: a fence without a language (```bash for commands, ```text else)")
            elif lang.split()[0] in SHELL_LANGS:
                found += [(f"{page}:{line}", cmd) for cmd in commands_of(body)]
    return found, untagged


def entry_for(cmd: str) -> Entry | None:
    if cmd in COMMANDS:
        return COMMANDS[cmd]
    return next((entry for pattern, entry in FAMILIES if pattern.search(cmd)), None)


def problems(root: Path = ROOT, pages: dict[str, int | None] = PAGES) -> list[str]:
    found, out = page_commands(root, pages)
    out += [f"{where}: not run and no reason given: {cmd!r} (add it to COMMANDS or FAMILIES in "
            "tests/test_docs_commands.py)" for where, cmd in found if entry_for(cmd) is None]
    return out


# ------------------------------------------------------------------ the checks
def test_every_fenced_command_is_run_or_says_why_not():
    found, _ = page_commands()
    assert len(found) > 20 and any(cmd == "make demo" for _, cmd in found)
    assert not problems(), "\n".join(problems())
    present = {cmd for _, cmd in found}
    stale = sorted(set(COMMANDS) - present)
    assert not stale, f"COMMANDS names commands no page holds any more (drop them): {stale}"


def test_the_check_catches_a_new_command_and_an_untagged_fence(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n\n```bash\nmake demo   # known\nmake frobnicate \\\n  --now\n```\n"
                                        "\n```\nA = B\n```\n\n```text\nnot a command\n```\n")
    (tmp_path / "docs" / "deploy.md").write_text("# d\n\n## First\n```bash\nray status\n```\n## Second\n"
                                                 "```bash\nnot in the quick start\n```\n")
    found = problems(tmp_path, {"README.md": None, "docs/deploy.md": 1})
    assert len(found) == 2, found
    assert "README.md:9: a fence without a language" in found[0]
    assert "README.md:3: not run and no reason given: 'make frobnicate --now'" in found[1]


def test_every_named_test_exists():
    for entry in [*COMMANDS.values(), *(e for _, e in FAMILIES)]:
        if isinstance(entry, ByTest):
            path, _, name = entry.test.partition("::")
            assert re.search(rf"^(async )?def {re.escape(name)}\(", (ROOT / path).read_text(), re.M), entry.test


def test_readme_python_lines_name_the_venv_interpreter():
    """Outside the cluster section (where `python` is the node's environment, as the README says),
    every `python -m ...` in the README is `.venv/bin/python -m ...`: it works from a fresh shell."""
    text = (ROOT / "README.md").read_text()
    local = re.sub(r"^## Quick start on a GPU cluster\n.*?(?=^## )", "", text, flags=re.S | re.M)
    bare = [m.group(0) for m in re.finditer(r"(?<![\w/.])python3? -m [\w.]+", local)]
    assert not bare, f"write .venv/bin/python in: {bare}"


def _script_variables() -> set[str]:
    names = set()
    for path in [*(ROOT / "examples").rglob("*.sh")]:
        code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        names |= set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)(?::-|:\?|-)", code))
    own = {"SGRPO_AGENT_CONFIG"}  # set by the scripts themselves before it is read
    return names - own


def test_deploy_lists_every_variable_the_scripts_read():
    text = (ROOT / "docs" / "deploy.md").read_text()
    table = text.split("### Every variable the scripts read", 1)[1].split("\n### ", 1)[0]
    listed = set(re.findall(r"`([A-Z][A-Z0-9_]*)`", table))
    missing = sorted(_script_variables() - listed)
    assert not missing, f"docs/deploy.md's variable table lacks {missing}"
    assert {"DATA_DIR", "RETRIEVER_URL", "RUN_NAME", "EVAL_STEPS", "SHARED_FS", "PYTHON",
            "SKIP_HEALTH_CHECK"} <= _script_variables()


# ------------------------------------------------------------------ running them
@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """HOME of the fresh shells: every `~/...` of a cheap form lands here."""
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def world(home, tmp_path_factory) -> dict[str, str]:
    """The tiny inputs the cheap forms read, in HOME and beside it."""
    from openrlhf_sgrpo.assets import AssetMissing, minilm_dir
    from retriever_server.corpora import wiki_extracts_path, wiki_extracts_to_jsonl
    from test_searchr1_data import write_searchr1_parquet

    try:
        extracts, minilm = wiki_extracts_path(), minilm_dir()
    except (FileNotFoundError, AssetMissing) as err:
        pytest.skip(f"the tiny corpus's assets are missing: {err}")
    tiny = tmp_path_factory.mktemp("tiny")
    data = json.loads(extracts.read_text(encoding="utf-8"))
    (tiny / "subset.json").write_text(json.dumps({k: data[k] for k in list(data)[::480][:21]}))
    wiki_extracts_to_jsonl(tiny / "subset.json", tiny / "corpus.jsonl")
    splits = {"nq": ("train", "test"), "hotpotqa": ("train", "dev"), "triviaqa": ("test",), "popqa": ("test",),
              "2wikimultihopqa": ("dev",), "musique": ("dev",), "bamboogle": ("test",)}
    for name, names in splits.items():
        for split in names:
            rows = [{"id": f"{name}-{split}-{i}", "question": f"question {i} of {name}?", "golden_answers": [f"a{i}"]}
                    for i in range(2)]
            path = tiny / "flashrag" / name / f"{split}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (home / "my_questions.jsonl").write_text(
        '{"id": "m1", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}\n'
        '{"id": "m2", "question": "what is the capital of france", "golden_answers": ["Paris"]}\n')
    (home / "nq_hotpotqa_train").mkdir()
    write_searchr1_parquet(home / "nq_hotpotqa_train" / "train.parquet")
    # Search-R1's pair: a corpus and an IndexFlatIP whose row i is its line i (MiniLM vectors here)
    built = home / "idx"
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "retriever_server.build_index", "--corpus",
                           str(tiny / "corpus.jsonl"), "--model", str(minilm), "--out", str(built)],
                          cwd=ROOT, env=fresh_env(home), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (tiny / "e5_Flat.index").write_bytes((built / "index.faiss").read_bytes())
    return {"home": str(home), "tiny": str(tiny), "minilm": str(minilm), "repo": str(ROOT)}


def fresh_env(home: Path | str) -> dict[str, str]:
    """A login shell's environment: no VIRTUAL_ENV, no venv on PATH, no PYTHON; nothing from the hub."""
    return {"HOME": str(home), "PATH": FRESH_PATH, "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1"}


def fill(cheap: str, world: dict[str, str]) -> str:
    """``{home}``-style names filled in (not str.format: the commands hold shell ``${...}``)."""
    for key, value in world.items():
        cheap = cheap.replace("{" + key + "}", value)
    return cheap


def _run(cheap: str, world: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", fill(cheap, world)], cwd=ROOT, env=fresh_env(world["home"]),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


@pytest.fixture(scope="module")
def ran(world) -> dict[str, subprocess.CompletedProcess]:
    """Every Run's cheap form (each once), data first, the rest side by side."""
    runs = {e.cheap: e for e in COMMANDS.values() if isinstance(e, Run)}
    out: dict[str, subprocess.CompletedProcess] = {}
    for phase in (0, 1):
        todo = [c for c, e in runs.items() if e.phase == phase]
        with ThreadPoolExecutor(max_workers=3) as pool:
            out.update(zip(todo, pool.map(lambda c: _run(c, world), todo)))
    return out


@pytest.mark.slow
def test_cheap_forms_run_from_a_fresh_shell(ran, world):
    failed = []
    for cmd, entry in COMMANDS.items():
        if not isinstance(entry, Run):
            continue
        proc = ran[entry.cheap]
        text = proc.stdout + proc.stderr
        if proc.returncode != 0 or entry.expect not in text:
            failed.append(f"{cmd!r} as {fill(entry.cheap, world)!r}: rc {proc.returncode}, expected "
                          f"{entry.expect!r}\n{text[-1500:]}")
    assert not failed, "\n\n".join(failed)
    index = Path(world["home"]) / "data" / "wiki18" / "e5-index"
    assert not (index / "index.faiss").is_symlink() and (index / "index.faiss").stat().st_nlink == 2, \
        "the PREBUILT route must leave a folder that works on its own (a hard link, not a symlink)"
    dry = ran[COMMANDS[f"DRY_RUN=1 {TRAIN}"].cheap]
    assert f"{ROOT}/.venv/bin/python -m openrlhf_sgrpo.cli.train_ppo_ray" in dry.stderr  # found without PYTHON


def readme_inline_commands() -> list[str]:
    """The README's inline `.venv/bin/python -m MODULE ...` spans (outside fences)."""
    text = re.sub(r"^(```|~~~).*?^\1\s*$", "", (ROOT / "README.md").read_text(), flags=re.S | re.M)
    return [m.group(1) for m in re.finditer(r"`(\.venv/bin/python -m [^`]+)`", text)]


@pytest.mark.slow
def test_synopses_and_readme_lines_name_only_flags_their_cli_has(home):
    """Each synopsis (and each inline `.venv/bin/python -m ...` of the README): its CLI's --help runs
    from a fresh shell and names every --flag the page uses."""
    found, _ = page_commands()
    by_module: dict[str, set[str]] = {}
    lines = [cmd for _, cmd in found if isinstance(entry_for(cmd), Help)] + readme_inline_commands()
    for cmd in lines:
        module = re.search(r"-m ([\w.]+)", cmd).group(1)
        by_module.setdefault(module, set()).update(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", cmd))
    assert {"retriever_server.serve", "openrlhf_sgrpo.demo"} <= set(by_module), by_module

    def help_of(module: str) -> str:
        proc = _run(f".venv/bin/python -m {shlex.quote(module)} --help", {"home": str(home)})
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    with ThreadPoolExecutor(max_workers=3) as pool:
        helps = dict(zip(by_module, pool.map(help_of, by_module)))
    unknown = {m: sorted(f for f in flags if f not in helps[m]) for m, flags in by_module.items()}
    assert not any(unknown.values()), f"flags the docs name that --help does not: {unknown}"


def test_the_fresh_shell_has_no_venv(home):
    """What the cheap forms run in: no VIRTUAL_ENV, no PYTHON, no venv on PATH, HOME of its own."""
    proc = _run("echo ${VIRTUAL_ENV:-none} ${PYTHON:-none} $HOME $PATH", {"home": str(home)})
    venv, python, where, path = proc.stdout.split()
    assert (venv, python, where, path) == ("none", "none", str(home), FRESH_PATH)
    assert sys.prefix not in path.split(":") and os.environ.get("HOME") != str(home)
