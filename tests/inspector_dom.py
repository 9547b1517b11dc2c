"""What the browser tests read from a rendered inspector page, and how they compare it with the
jsonl records it came from (shared by the scripted-run and the demo's report tests)."""

from __future__ import annotations

import json
import re

import pytest

from agent_env.actions import strip_think
from openrlhf_sgrpo.inspect.browser import Browser
from openrlhf_sgrpo.rollout_records.store import list_step_files, read_step_file


def records(run_dir) -> dict[str, list[dict]]:
    """Every step file's groups by ``'<phase>/<step>'``."""
    return {f"{f.phase}/{f.step}": read_step_file(f.path).groups for f in list_step_files(run_dir)}


DOM_STATE = """(() => {
  const num = v => v === "" || v === null ? null : Number(v);
  return {
    rendered: document.body.getAttribute("data-rendered"),
    stepKey: document.body.getAttribute("data-step-key"),
    errors: window.__reportErrors, pwned: window.__pwned === undefined ? null : window.__pwned,
    shown: [num(document.getElementById("shown").getAttribute("data-groups")),
            num(document.getElementById("shown").getAttribute("data-samples"))],
    bars: [...document.querySelectorAll("svg.hist rect.bar")].map(b => [num(b.getAttribute("data-stratum")),
            num(b.getAttribute("data-count"))]),
    strataRows: [...document.querySelectorAll("table.strata tr[data-stratum]")].map(r => [
            num(r.getAttribute("data-stratum")), r.querySelector(".reward-mean").textContent]),
    groups: [...document.querySelectorAll("article.group")].map(g => ({
      promptId: g.getAttribute("data-prompt-id"), noVariance: g.getAttribute("data-no-variance"),
      hidden: g.classList.contains("hidden"), question: g.querySelector(".question").textContent,
      samples: [...g.querySelectorAll("details.sample")].map(s => ({
        sample: num(s.getAttribute("data-sample")), stratum: num(s.getAttribute("data-stratum")),
        reward: num(s.getAttribute("data-reward")), advantage: num(s.getAttribute("data-advantage")),
        san: num(s.getAttribute("data-san")), gn: num(s.getAttribute("data-gn")),
        hidden: s.classList.contains("hidden"),
        advClass: s.querySelector("summary .adv").className, advText: s.querySelector("summary .adv").textContent,
        turns: [...s.querySelectorAll(".turn")].map(t => ({
          kind: t.getAttribute("data-kind"), cls: t.className,
          think: (t.querySelector(".seg-think") || {}).textContent || "",
          action: (t.querySelector(".seg-action") || {}).textContent || "",
          passages: t.querySelectorAll(".passage").length,
          result: (t.querySelector(".seg-result") || {}).textContent || null}))}))}))};
})()"""


def set_control(browser: Browser, element_id: str, value) -> dict:
    """Change a control the way a click does (its change event), then read the page again."""
    prop = "checked" if isinstance(value, bool) else "value"
    browser.evaluate(f"(() => {{ const e = document.getElementById({json.dumps(element_id)}); "
                     f"e.{prop} = {json.dumps(value)}; e.dispatchEvent(new Event('change')); }})()")
    return browser.evaluate(DOM_STATE)


def sign_class(v: float | None) -> str:
    return "adv-none" if v is None else "adv-pos" if v > 1e-12 else "adv-neg" if v < -1e-12 else "adv-zero"


def assert_dom_matches(state: dict, groups: list[dict]) -> None:
    """The page shows a step's groups by group index (then prompt id), whatever order the step file
    holds them in: an evaluation writes each group as its trajectory ends, so its file order is the
    finishing order and changes from run to run."""
    groups = sorted(groups, key=lambda g: (g.get("group", 0), str(g.get("prompt_id", ""))))
    assert [g["promptId"] for g in state["groups"]] == [g["prompt_id"] for g in groups]
    for dom, rec in zip(state["groups"], groups):
        assert dom["question"] == rec["question"]
        by_index = {s["sample"]: s for s in rec["samples"]}
        assert sorted(s["sample"] for s in dom["samples"]) == sorted(by_index)
        strata = [s["stratum"] for s in dom["samples"]]
        assert strata == sorted(strata)  # samples sorted by stratum
        rewards = {s["reward"] for s in rec["samples"]}
        assert dom["noVariance"] == ("1" if len(rewards) == 1 and len(rec["samples"]) > 1 else "0")
        for s in dom["samples"]:
            r = by_index[s["sample"]]
            assert (s["stratum"], s["reward"]) == (r["stratum"], r["reward"])
            for key in ("advantage", "san", "gn"):
                assert (s[key] is None) == (r[key] is None) and (r[key] is None or s[key] == pytest.approx(r[key]))
            assert sign_class(r["advantage"]) in s["advClass"].split()
            if r["advantage"] is not None and abs(r["advantage"]) > 1e-12:
                assert s["advText"].startswith("A " + ("+" if r["advantage"] > 0 else "\u2212"))
            assert [t["kind"] for t in s["turns"]] == [t["kind"] for t in r["turns"]]
            for t, rt in zip(s["turns"], r["turns"]):
                assert f"turn-{rt['kind']}" in t["cls"].split()
                assert t["action"] == strip_think(rt["text"]).strip()
                if rt["kind"] == "search" and rt["doc_ids"]:
                    # the passages the model saw: an observation cut at max_obs_tokens holds fewer
                    # than were retrieved (Search-R1's "Doc k(Title: ...)" lines)
                    seen = len(re.findall(r"(?:^|<information>)Doc \d+\(Title: ", rt["output"], re.M))
                    assert t["passages"] == seen <= len(rt["doc_ids"]) and seen >= 1
                if rt["kind"] == "code":
                    assert t["result"] is not None and t["result"] in rt["output"]
