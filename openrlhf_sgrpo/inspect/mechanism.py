"""The mechanism table: per step and tool-call stratum, share, mean reward and advantage mass.

Reads the ``sgrpo/stratum{k}/*`` keys of ``metrics.jsonl`` (:mod:`openrlhf_sgrpo.mechanism`)
and renders one static HTML table, a row per step, a column block per stratum, the mass split
into its SAN and GN parts so a reader sees at a glance that SAN moves no mass between tool-call
strata (0 with tool-call strata; not so for the random-strata control) and which strata GN
pays. Plain HTML, no script: it reads the same with the page's JavaScript off.
"""

from __future__ import annotations

import math
from html import escape

from openrlhf_sgrpo.mechanism import PREFIX, STRATUM_NAMES

MAX_ROWS = 40  # steps shown, evenly spaced with the first and last kept


def mechanism_rows(rows: list[dict], phase: str = "train") -> list[tuple[int, dict[str, dict[str, float | None]]]]:
    """(step, {stratum: {field: value}}) for each step that logged the mechanism, in step order
    (the last record of a step wins, as in the curves); strata with no share are left out."""
    by_step: dict[int, dict[str, dict[str, float | None]]] = {}
    for row in rows:
        step = row.get("step")
        if row.get("phase", "train") != phase or not isinstance(step, int) or isinstance(step, bool):
            continue
        strata = {}
        for name in STRATUM_NAMES:
            base = f"{PREFIX}{name}/"
            share = row.get(base + "share")
            if not isinstance(share, (int, float)) or share <= 0:
                continue
            strata[name] = {f: _number(row.get(base + f)) for f in ("share", "reward", "adv_mass_san", "adv_mass_gn",
                                                                     "adv_mass")}
        if strata:
            by_step[step] = strata
    steps = sorted(by_step)
    if len(steps) > MAX_ROWS:
        picks = sorted({steps[round(i * (len(steps) - 1) / (MAX_ROWS - 1))] for i in range(MAX_ROWS)})
        steps = picks
    return [(s, by_step[s]) for s in steps]


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def _cell(value: float | None, signed: bool = False) -> str:
    if value is None:
        return '<td class="num">–</td>'
    cls = "num" if not signed else ("num pos" if value > 5e-7 else "num neg" if value < -5e-7 else "num zero")
    return f'<td class="{cls}">{value:+.3f}</td>' if signed else f'<td class="{cls}">{value:.3f}</td>'


def mechanism_html(rows: list[dict]) -> str:
    """The ``<section id="mechanism">`` table ('' when the run logged no mechanism keys)."""
    table = mechanism_rows(rows)
    if not table:
        return ""
    names = [n for n in STRATUM_NAMES if any(n in strata for _, strata in table)]
    head1 = "".join(f'<th colspan="4">{escape(n.replace("stratum", "k = ").replace("plus", "+"))} tool calls</th>'
                    for n in names)
    head2 = "".join("<th>share</th><th>reward</th><th>SAN mass</th><th>GN mass</th>" for _ in names)
    body = []
    for step, strata in table:
        cells = []
        for n in names:
            v = strata.get(n)
            if v is None:
                cells.append('<td class="num" colspan="4">–</td>')
                continue
            cells.append(_cell(v["share"]) + _cell(v["reward"]) + _cell(v["adv_mass_san"], True)
                         + _cell(v["adv_mass_gn"], True))
        body.append(f'<tr data-step="{step}"><th>{step}</th>{"".join(cells)}</tr>')
    return (f'<section id="mechanism"><h2>Advantage mass per tool-call stratum (metrics.jsonl, train): '
            f'sum of alpha&middot;A_SAN and (1&minus;alpha)&middot;A_GN over the stratum&#39;s samples / batch size '
            f'(docs/mechanism.md)</h2><div class="mass-wrap"><table class="mass"><thead><tr><th rowspan="2">step</th>'
            f'{head1}</tr><tr>{head2}</tr></thead><tbody>{"".join(body)}</tbody></table></div></section>')
