"""``python -m openrlhf_sgrpo.inspect``: the CLI, the page's numbers, and the page as a person sees it.

The run folder is written by the real record path from real agent episodes (scripted policy
text at the engine boundary only, see ``tests/scripted_rollouts.py``). The browser
tests render the report in headless Chromium over the DevTools protocol and check the DOM
against the jsonl, the filters and the step selector by driving them, and that the page logs
no script error and makes no network request. They skip, with the reason, when no Chromium is
installed (Debian: ``apt-get install chromium-headless-shell``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import scripted_rollouts as scripted
from inspector_dom import DOM_STATE, assert_dom_matches, records, set_control
from shm_check import marked_processes

from openrlhf_sgrpo import assets
from openrlhf_sgrpo.inspect.browser import APT_PACKAGE, Browser, find_chromium, group_members
from openrlhf_sgrpo.inspect.curves import CURVES, curves_html, series
from openrlhf_sgrpo.inspect.load import StepRecords, load_run, thin_steps
from openrlhf_sgrpo.inspect.mechanism import MAX_ROWS, mechanism_html, mechanism_rows
from openrlhf_sgrpo.inspect.view import split_passages, step_view, turn_view
from openrlhf_sgrpo.mechanism import STRATUM_NAMES
from openrlhf_sgrpo.rollout_records.store import step_path
from sandbox.reaper import proc_stat

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason=f"no Chromium on PATH (install Debian's {APT_PACKAGE}: "
                                                             f"apt-get install -y {APT_PACKAGE})")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("inspect-run")
    scripted.scripted_run(path, assets.load_qwen2_tokenizer())
    return path


def inspect_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "openrlhf_sgrpo.inspect", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


@pytest.fixture(scope="module")
def report(run_dir):
    out = run_dir / "report.html"
    proc = inspect_cli(str(run_dir), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stdout
    return out


# ---------------------------------------------------------------- CLI and file

def test_report_is_self_contained_and_keeps_model_text_inert(report):
    html = report.read_text(encoding="utf-8")
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=", html, re.IGNORECASE)
    assert "http://" not in html.split('<script id="rollout-data"')[0]  # no external reference in the markup
    assert html.count("</script>") == 3  # the error hook, the data, the code: model text closes none
    assert scripted.HOSTILE not in html and "\\u003c/script\\u003e" in html
    assert "<svg class=\"curve\"" in html


@pytest.mark.parametrize("setup, message", [
    ("missing", "does not exist"),
    ("empty", "no rollout records in"),
    ("corrupt", "step_000003.jsonl:2: not a JSON record"),
    ("metrics", "metrics.jsonl:1: not a JSON metrics record"),
])
def test_bad_input_is_named_with_exit_2(tmp_path, run_dir, setup, message):
    target = tmp_path / "run"
    if setup != "missing":
        target.mkdir()
    if setup in ("corrupt", "metrics"):
        good = step_path(run_dir, "train", 1).read_text().splitlines()[0]
        path = step_path(target, "train", 3)
        path.parent.mkdir(parents=True)
        path.write_text(good + "\n" + ("{broken\n" if setup == "corrupt" else good + "\n"))
        if setup == "metrics":
            (target / "metrics.jsonl").write_text("{oops\n")
    proc = inspect_cli(str(target), "--out", str(tmp_path / "r.html"), "--quiet")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "r.html").exists()


def test_bad_arguments_exit_2(tmp_path, run_dir):
    assert inspect_cli(str(run_dir), "--max-steps", "0").returncode == 2
    proc = inspect_cli(str(run_dir), "--out", str(tmp_path), "--quiet")
    assert proc.returncode == 2 and "is a folder" in proc.stderr
    proc = inspect_cli(str(run_dir), "--out", str(tmp_path / "nope" / "r.html"), "--quiet")
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_a_torn_last_line_is_a_warning_not_a_failure(tmp_path, run_dir):
    target = tmp_path / "run"
    lines = step_path(run_dir, "train", 1).read_text().splitlines(keepends=True)
    path = step_path(target, "train", 1)
    path.parent.mkdir(parents=True)
    path.write_text("".join(lines) + lines[0][:40])  # a crash mid-write
    proc = inspect_cli(str(target), "--quiet")
    assert proc.returncode == 0 and "warning:" in proc.stderr and "incomplete last line" in proc.stderr
    assert (target / "rollouts.html").exists()


# ---------------------------------------------------------------- numbers the page shows

def test_step_summary_numbers_come_from_the_records(run_dir):
    for key, groups in records(run_dir).items():
        phase, step = key.split("/")
        view = step_view(StepRecords(phase, int(step), groups, len(groups)))
        samples = [s for g in groups for s in g["samples"]]
        for cell in view["strata"]:
            mine = [s for s in samples if s["stratum"] == cell["stratum"]]
            assert cell["count"] == len(mine)
            assert cell["reward_mean"] == pytest.approx(sum(s["reward"] for s in mine) / len(mine))
        assert sum(c["count"] for c in view["strata"]) == len(samples) == view["n_samples"]
        flat = {g["prompt_id"]: len({s["reward"] for s in g["samples"]}) == 1 and len(g["samples"]) > 1 for g in groups}
        assert {g["prompt_id"]: g["no_variance"] for g in view["groups"]} == flat
        for g in view["groups"]:
            order = [(s["stratum"], -s["reward"]) for s in g["samples"]]
            assert order == sorted(order)
    step1 = step_view(StepRecords("train", 1, records(run_dir)["train/1"], 3))
    assert step1["no_variance_groups"] == 1  # q-hamlet: every answer wrong


def test_passages_are_split_as_format_docs_writes_them():
    from agent_env.observations import Doc, format_docs, information_block

    docs = [Doc("1", "Paris", "Paris is the capital.\nSecond line."), Doc("2", "Lyon (city)", "Lyon.")]
    assert split_passages(format_docs(docs)) == [
        {"rank": 1, "title": "Paris", "text": "Paris is the capital.\nSecond line."},
        {"rank": 2, "title": "Lyon (city)", "text": "Lyon."}]
    assert split_passages("search failed: timed out") == []
    cut = format_docs(docs)[: format_docs(docs).index("(city)")]  # max_obs_tokens ended inside a title
    assert split_passages(cut) == [{"rank": 1, "title": "Paris", "text": "Paris is the capital.\nSecond line."},
                                   {"rank": 2, "title": "Lyon ", "text": ""}]
    block = information_block(format_docs(docs), lambda text: text)
    view = turn_view({"kind": "search", "text": "<think>look it up</think>\n<search> q </search>", "output": block,
                      "output_chars": 5000, "tokens": 9})
    assert (view["think"], view["action"]) == ("look it up", "<search> q </search>")
    assert [p["title"] for p in view["passages"]] == ["Paris", "Lyon (city)"] and view["output_text"] == ""
    assert view["output_shown"] == len(block) < view["output_chars"] and "text" not in view


def test_curves_and_step_thinning(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert series(rows, "reward") == [(1.0, rows[0]["reward"]), (2.0, rows[1]["reward"])]
    assert curves_html(rows).count("<svg") == sum(1 for key, _ in CURVES if series(rows, key))
    assert curves_html([]) == ""
    files = [type("F", (), {"phase": "train", "step": s})() for s in range(1, 11)]
    files.append(type("F", (), {"phase": "eval", "step": 10})())
    kept, dropped = thin_steps(files, 4)
    assert [f.step for f in kept if f.phase == "train"] == [1, 4, 7, 10] and dropped == 6
    assert any(f.phase == "eval" for f in kept)
    assert len(load_run(run_dir, max_groups=1, progress=False).steps[0].groups) == 1


def test_mechanism_table_shows_each_steps_mass_per_tool_call_stratum(run_dir, report):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    table = mechanism_rows(rows)
    assert [step for step, _ in table] == [r["step"] for r in rows if r.get("phase", "train") == "train"]
    for (step, strata), row in zip(table, rows):
        assert strata and set(strata) == {n for n in STRATUM_NAMES if row[f"sgrpo/{n}/share"] > 0}
        for name, v in strata.items():
            assert v["adv_mass_gn"] == row[f"sgrpo/{name}/adv_mass_gn"] and v["share"] == row[f"sgrpo/{name}/share"]
    html = report.read_text(encoding="utf-8")
    section = html[html.index('<section id="mechanism">'):]
    section = section[:section.index("</section>")]
    step, strata = table[0]
    name, v = next(iter(strata.items()))
    row_html = section[section.index(f'<tr data-step="{step}">'):]
    row_html = row_html[:row_html.index("</tr>")]
    assert f'{v["share"]:.3f}' in row_html and f'{v["adv_mass_gn"]:+.3f}' in row_html
    assert mechanism_html([{"step": 1, "reward": 0.5}]) == ""  # a run without the keys: no section
    many = [{"step": s, "sgrpo/stratum0/share": 1.0, "sgrpo/stratum0/adv_mass_gn": 0.0} for s in range(1, 101)]
    thinned = [s for s, _ in mechanism_rows(many)]
    assert len(thinned) == MAX_ROWS and thinned[0] == 1 and thinned[-1] == 100


# ---------------------------------------------------------------- as a person sees it

@pytest.fixture(scope="module")
def page(report):
    if CHROMIUM is None:
        pytest.skip(f"no Chromium on PATH (apt-get install -y {APT_PACKAGE})")
    with Browser(CHROMIUM) as browser:
        browser.open(report)
        yield browser


@needs_chromium
def test_rendered_dom_matches_the_records_with_no_script_errors(page, run_dir, report):
    recs = records(run_dir)
    steps = page.evaluate("[...document.querySelectorAll('#step-select option')].map(o => o.textContent)")
    assert steps == ["train \u00b7 step 1 (3 groups)", "train \u00b7 step 2 (2 groups)", "eval \u00b7 step 2 (2 groups)"]
    seen_kinds, thinks = set(), 0
    for index, key in enumerate(["train/1", "train/2", "eval/2"]):
        state = set_control(page, "step-select", str(index))
        assert state["rendered"] == "1" and state["stepKey"] == key
        assert_dom_matches(state, recs[key])
        samples = [s for g in recs[key] for s in g["samples"]]
        counts = {}
        for s in samples:
            counts[s["stratum"]] = counts.get(s["stratum"], 0) + 1
        assert state["bars"] == [list(kv) for kv in sorted(counts.items())] and state["bars"]
        for stratum, shown in state["strataRows"]:
            mine = [s["reward"] for s in samples if s["stratum"] == stratum]
            assert shown == f"{sum(mine) / len(mine):.3f}"
        assert state["shown"] == [len(recs[key]), len(samples)]
        for g in state["groups"]:
            for s in g["samples"]:
                seen_kinds.update(t["kind"] for t in s["turns"])
                thinks += sum(bool(t["think"]) for t in s["turns"])
    assert seen_kinds == {"search", "code", "answer", "none"} and thinks > 10
    # model text containing markup stayed text: nothing it said ran
    set_control(page, "step-select", "0")
    assert page.evaluate("document.getElementById('groups').textContent.includes(" + json.dumps(scripted.HOSTILE) + ")")
    assert page.evaluate("window.__pwned === undefined")
    assert page.errors == [] and page.evaluate("window.__reportErrors") == []
    assert page.requests == [report.resolve().as_uri()]  # the page itself, nothing else


@needs_chromium
def test_filters_and_step_selector_work_like_a_person_uses_them(page, run_dir):
    recs = records(run_dir)["train/1"]
    state = set_control(page, "step-select", "0")
    state = set_control(page, "filter-novar", True)
    visible = [g["promptId"] for g in state["groups"] if not g["hidden"]]
    assert visible == ["q-hamlet"] and state["shown"][0] == 1
    state = set_control(page, "filter-novar", False)
    state = set_control(page, "filter-stratum", "2")
    two = [s for g in recs for s in g["samples"] if s["stratum"] == 2]
    shown = [s for g in state["groups"] for s in g["samples"] if not s["hidden"]]
    assert len(shown) == len(two) == state["shown"][1] and all(s["stratum"] == 2 for s in shown)
    assert state["shown"][0] == len({g["prompt_id"] for g in recs if any(s["stratum"] == 2 for s in g["samples"])})
    state = set_control(page, "filter-stratum", "all")
    state = set_control(page, "filter-reward", "pos")
    shown = [s for g in state["groups"] for s in g["samples"] if not s["hidden"]]
    assert {s["reward"] for s in shown} == {1.0}
    assert len(shown) == sum(s["reward"] > 0 for g in recs for s in g["samples"])
    state = set_control(page, "filter-reward", "all")
    page.evaluate("document.getElementById('next').click()")
    assert page.evaluate(DOM_STATE)["stepKey"] == "train/2"
    assert page.errors == []


@needs_chromium
def test_closing_the_browser_ends_every_process_of_it():
    """Debian's chromium-headless-shell is a shell script that runs the browser as its child; ending
    only the process we started left the browser running, orphaned (one was found alive after a
    CI run). After the block no process of it runs, and none is left as our zombie."""
    with Browser(CHROMIUM) as browser:
        marker = f"--user-data-dir={browser.profile_dir}"
        assert marked_processes(marker), "the browser should run inside the block"
        group = browser.pid
    assert marked_processes(marker) == []
    assert [m for m in group_members(group) if m[2] == os.getpid()] == []


SUBREAPER_BROWSER = """
import ctypes, json, os, sys, time
from openrlhf_sgrpo.demo.memory import descendants
from openrlhf_sgrpo.inspect.browser import Browser
from sandbox.reaper import proc_stat
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER, as the sandbox service sets it
left = []
for _ in range(int(sys.argv[2])):
    with Browser(sys.argv[1]):
        pass
    time.sleep(1)  # what ends late comes here meanwhile
    left.append([proc_stat(f"/proc/{pid}/stat")[1] for pid in descendants(os.getpid())])
print(json.dumps(left))
"""


@needs_chromium
def test_a_subreaper_closing_the_browser_keeps_no_zombie_of_it():
    """Where the closing process is a child subreaper (the sandbox service; a test worker after a
    sandbox backend ran in it), each of the browser's processes comes back to it when it ends. None
    may stay a zombie below it: Chromium's main process shows as a zombie while its other threads
    still end, and its ended children reach the closer only after that (several were found below
    a CI worker)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SUBREAPER_BROWSER, CHROMIUM, "4"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == [[]] * 4


def test_a_zombie_seen_parentless_in_one_walk_is_reaped_in_the_next(monkeypatch):
    """The race behind a CI failure of the test above: one walk of /proc read a zombie of the
    browser while its parent was a member and the parent was reaped before its own entry was read,
    so the zombie looked parentless; the next walk shows it as this process's child. A real zombie
    child stands in for it and two scripted walks for /proc: closing must not settle on the first."""
    from openrlhf_sgrpo.inspect import browser as browser_module

    leader = subprocess.Popen([sys.executable, "-c", "pass"])
    leader.wait()
    orphan = subprocess.Popen([sys.executable, "-c", "pass"])
    while process_state(orphan.pid) != "Z":
        time.sleep(0.01)  # ended, not yet reaped: a zombie below this process
    gone_parent = 2 ** 22 + 1  # above the kernel's pid_max: no process has it
    walks = iter([[(orphan.pid, "Z", gone_parent)], [(orphan.pid, "Z", os.getpid())]])
    monkeypatch.setattr(browser_module, "group_members", lambda group: next(walks, []))
    closing = Browser(sys.executable)
    closing._proc = leader
    try:
        assert closing._settle_group(leader.pid, grace_s=5.0)
        assert process_state(orphan.pid) is None  # reaped, not left a zombie
    finally:
        closing._loop.close()
        closing._profile.cleanup()
        if process_state(orphan.pid) == "Z":
            orphan.wait()


def process_state(pid: int) -> str | None:
    """A process's state letter from /proc, None once it is gone (reaped)."""
    stat = proc_stat(f"/proc/{pid}/stat")
    return stat[1] if stat else None
