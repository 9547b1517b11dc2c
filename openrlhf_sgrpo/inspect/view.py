"""Records -> what the page shows: per-step strata summaries and display-ready turns.

The page's script only lays things out; every number it shows (histograms, means per stratum,
"no reward variance") is computed here, where it is tested.
"""

from __future__ import annotations

import re
from collections import defaultdict

from agent_env.actions import strip_think
from openrlhf_sgrpo.inspect.load import RunData, StepRecords

# Groups whose reward spread is below this have no variance: every advantage is 0.
NO_VARIANCE_TOL = 1e-9
_THINK = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.DOTALL)
# agent_env.observations.format_docs writes "Doc {i}(Title: {title}) {text}\n" per passage. An
# observation cut at max_obs_tokens can end inside a title: that passage is shown, title cut and
# text empty, rather than glued to the one before.
_DOC = re.compile(r"(?:^|\n)Doc (\d+)\(Title: ([^\n]*?)(?:\) |\Z)")
_WRAPPED = re.compile(r"^\s*<(information|result)>(.*?)(?:</\1>\s*)?$", re.DOTALL)


def split_passages(body: str) -> list[dict]:
    """Search-R1 passages of an ``<information>`` body: [{rank, title, text}] ([] if none)."""
    hits = list(_DOC.finditer(body))
    return [{"rank": int(m.group(1)), "title": m.group(2),
             "text": body[m.end(): hits[i + 1].start() if i + 1 < len(hits) else len(body)].strip()}
            for i, m in enumerate(hits)]


def unwrap_output(output: str) -> tuple[str | None, str]:
    """('information' | 'result' | None, inner text) of a tool output block."""
    m = _WRAPPED.match(output)
    return (m.group(1), m.group(2)) if m else (None, output)


def turn_view(turn: dict) -> dict:
    """The record's turn with its text split into think and visible action, and its output
    parsed into passages or a result (the raw strings are left out: the page never shows them)."""
    text, output = turn.get("text") or "", turn.get("output") or ""
    view = {k: v for k, v in turn.items() if k not in ("text", "output")}
    view["think"] = "\n".join(t.strip() for t in _THINK.findall(text) if t.strip())
    view["action"] = strip_think(text).strip()
    wrapper, inner = unwrap_output(output)
    view["output_kind"] = wrapper or ("feedback" if inner.strip() else None)
    view["passages"] = split_passages(inner) if wrapper == "information" else []
    view["output_text"] = "" if view["passages"] else inner.strip()
    view["output_shown"] = len(output)
    return view


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def group_view(group: dict) -> dict:
    """Samples sorted by stratum (then reward, best first), the group's reward stats."""
    samples = [dict(s, turns=[turn_view(t) for t in s.get("turns") or []]) for s in group.get("samples", [])]
    samples.sort(key=lambda s: (s.get("stratum", 0), -(_num(s.get("reward")) or 0.0), s.get("sample", 0)))
    rewards = [r for r in (_num(s.get("reward")) for s in samples) if r is not None]
    view = {k: v for k, v in group.items() if k != "samples"}
    view["samples"] = samples
    view["reward_mean"] = sum(rewards) / len(rewards) if rewards else None
    view["reward_spread"] = (max(rewards) - min(rewards)) if rewards else None
    view["no_variance"] = len(rewards) >= 2 and view["reward_spread"] <= NO_VARIANCE_TOL
    view["strata"] = sorted({s.get("stratum", 0) for s in samples})
    return view


def strata_summary(groups: list[dict]) -> list[dict]:
    """Per stratum over the step's recorded samples: count, mean reward, mean advantage."""
    acc: dict[int, dict] = defaultdict(lambda: {"count": 0, "reward": [], "advantage": [], "label": ""})
    for g in groups:
        for s in g.get("samples", []):
            cell = acc[int(s.get("stratum", 0))]
            cell["count"] += 1
            cell["label"] = s.get("stratum_label") or str(s.get("stratum", 0))
            for key in ("reward", "advantage"):
                if _num(s.get(key)) is not None:
                    cell[key].append(float(s[key]))
    mean = lambda xs: sum(xs) / len(xs) if xs else None
    return [{"stratum": k, "label": c["label"], "count": c["count"], "reward_mean": mean(c["reward"]),
             "advantage_mean": mean(c["advantage"])} for k, c in sorted(acc.items())]


def step_view(step: StepRecords) -> dict:
    groups = [group_view(g) for g in step.groups]
    samples = [s for g in groups for s in g["samples"]]
    rewards = [r for r in (_num(s.get("reward")) for s in samples) if r is not None]
    return {
        "key": f"{step.phase}/{step.step}", "phase": step.phase, "step": step.step,
        "groups": groups, "total_groups": step.total_groups, "n_samples": len(samples),
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "no_variance_groups": sum(g["no_variance"] for g in groups),
        "strata": strata_summary(step.groups),
    }


def run_view(run: RunData) -> dict:
    """The page's data: steps in selector order (train first, by step; then other phases)."""
    steps = sorted(run.steps, key=lambda s: (s.phase != "train", s.phase, s.step))
    return {"run": run.run_dir.resolve().name, "steps": [step_view(s) for s in steps if s.groups],
            "warnings": run.warnings}
