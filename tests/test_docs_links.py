"""The guides cannot drift from the code: every relative link (and its #anchor), every
`python -m MODULE` and every script path (`dir/name.py`, `dir/name.sh`) named in README.md,
CONTRIBUTING.md and docs/ must resolve in this checkout. Pure text and file lookups, no imports of
the project (well under a second)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Paths that name a file of an installed upstream package (e.g. `openrlhf/models/loss.py`) are
# looked up in that package; when it is not installed here they are not checked.
UPSTREAM = {"openrlhf", "vllm", "flashrag", "deepspeed", "transformers", "torch", "ray", "sandbox_fusion"}
# Files of peer repositories that the docs cite (not installed, not ours): path -> whose.
PEER_FILES = {
    "search_r1/llm_agent/generation.py": "Search-R1",
    "sandbox/runners/base.py": "SandboxFusion",
    "sandbox/server/sandbox_api.py": "SandboxFusion",
}

FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
PY_MODULE = re.compile(r"\bpython3?\s+-m\s+([A-Za-z_][\w.]*)")
SCRIPT = re.compile(r"(?<![\w./${}~-])((?:[\w.{},-]+/)+[\w.{},-]*\.(?:py|sh))(?![\w/])")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def doc_files(root: Path = ROOT) -> list[Path]:
    files = [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").rglob("*.md"))]
    return [f for f in files if f.is_file()]


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(FENCE.sub("", path.read_text())):
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        out.add(slug if n == 0 else f"{slug}-{n}")
        seen[slug] = n + 1
    return out


@lru_cache(maxsize=4)
def tracked_files(root: Path) -> tuple[str, ...]:
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, text=True, check=True).stdout
        return tuple(out.split())
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk it
        return tuple(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".venv" not in p.parts)


def expand_braces(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [q for alt in m.group(1).split(",") for q in expand_braces(path[:m.start()] + alt + path[m.end():])]


def _upstream_file(path: str) -> bool | None:
    """True/False when `path` starts with an installed upstream package; None when not upstream."""
    top = path.split("/", 1)[0]
    if top not in UPSTREAM:
        return None
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return True  # not installed here: nothing to check against
    return any((Path(loc).parent / path).exists() for loc in spec.submodule_search_locations)


def script_exists(path: str, doc: Path, root: Path) -> bool:
    if path in PEER_FILES:
        return True
    up = _upstream_file(path)
    if up is not None:
        return up
    if (root / path).exists() or (doc.parent / path).exists():
        return True
    # a path named relative to its package (`local/rollout.py`, `openrlhf_ext/actors.py`)
    return any(f == path or f.endswith("/" + path) for f in tracked_files(root))


def module_exists(module: str, root: Path) -> bool:
    parts = module.split(".")
    if (root / parts[0]).is_dir() or (root / f"{parts[0]}.py").is_file():  # ours: look at the files
        base = root.joinpath(*parts)
        return (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()
                or (base / "__main__.py").is_file())
    try:
        return importlib.util.find_spec(parts[0]) is not None  # stdlib or installed (pip, pytest, venv)
    except (ImportError, ValueError):
        return False


def problems(doc: Path, root: Path = ROOT) -> list[str]:
    """Every broken reference in one markdown file, as 'file:line: what'."""
    text = doc.read_text()
    rel = doc.relative_to(root) if doc.is_relative_to(root) else doc
    out = []

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    # links: outside code (a fenced block or inline code span is not a link); keep offsets for line numbers
    prose = FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    prose = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), prose)
    for m in LINK.finditer(prose):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.exists():
            out.append(f"{rel}:{line_of(m.start())}: link to a missing file: {target}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{rel}:{line_of(m.start())}: link to a missing heading: {target}")
    for m in PY_MODULE.finditer(text):
        if not module_exists(m.group(1).rstrip("."), root):
            out.append(f"{rel}:{line_of(m.start())}: python -m {m.group(1)}: no such module")
    for m in SCRIPT.finditer(text):
        raw = m.group(1)
        if raw.startswith(("http", "www.")) or "<" in raw:
            continue
        for path in expand_braces(raw):
            if not script_exists(path, doc, root):
                out.append(f"{rel}:{line_of(m.start())}: no such script: {path}")
    return out


def test_every_link_module_and_script_in_the_docs_resolves():
    docs = doc_files()
    assert ROOT / "README.md" in docs and len(docs) > 5
    found = [p for doc in docs for p in problems(doc)]
    assert not found, "broken references in the docs:\n" + "\n".join(found)


def test_the_check_fails_on_each_kind_of_broken_reference(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "tool.py").write_text("")
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## A section\n")
    good = tmp_path / "docs" / "good.md"
    good.write_text("# Good\n\n[other](other.md), [its section](other.md#a-section), [here](#good), "
                    "[web](https://example.org/x.md)\n\n```bash\npython -m pkg.tool --help\n```\n"
                    "Run `pkg/tool.py` or `python -m json.tool`; `[not a link](nowhere.md)` is code.\n")
    assert problems(good, tmp_path) == []
    bad = tmp_path / "docs" / "bad.md"
    bad.write_text("# Bad\n\n[gone](gone.md) and [no heading](other.md#no-such-section)\n\n"
                   "```bash\npython -m pkg.missing\nbash scripts/nowhere.sh\n```\n")
    found = problems(bad, tmp_path)
    assert len(found) == 4, found
    assert any("missing file: gone.md" in p for p in found)
    assert any("missing heading: other.md#no-such-section" in p for p in found)
    assert any("python -m pkg.missing" in p for p in found)
    assert any("no such script: scripts/nowhere.sh" in p for p in found)
    assert found[0].startswith("docs/bad.md:3:") or found[0].startswith(str(bad))


@pytest.mark.parametrize("heading, slug", [
    ("GRPO beside Stratified GRPO", "grpo-beside-stratified-grpo"),
    ("Evaluate: `python -m openrlhf_sgrpo.eval`", "evaluate-python--m-openrlhf_sgrpoeval"),
    ("The records (`schema_version` 1)", "the-records-schema_version-1"),
])
def test_anchors_follow_githubs_rule(heading, slug):
    assert github_slug(heading) == slug
