"""The report as one self-contained HTML file: inline CSS and JS, the data embedded as JSON.

No server, no CDN, no fetch: the file opens offline from a cluster's shared disk. Model text is
untrusted, so the script only ever puts it into the page with ``textContent`` (never as HTML)
and the embedded JSON escapes ``<``, ``>`` and ``&`` so no string can close its ``<script>``.
"""

from __future__ import annotations

import json
from html import escape

CSS = r"""
:root { --think:#ede7f6; --think-b:#7e57c2; --search:#e3f2fd; --search-b:#1e88e5; --code:#fff3e0;
  --code-b:#fb8c00; --answer:#e8f5e9; --answer-b:#43a047; --invalid:#ffebee; --invalid-b:#e53935;
  --pos:#1b7f3b; --neg:#c62828; --zero:#666; --line:#ddd; }
* { box-sizing: border-box; }
body { font: 13px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #222;
  background: #fafafa; }
header.top { padding: 10px 18px; background: #263238; color: #fff; }
header.top h1 { font-size: 17px; margin: 0; } header.top .sub { opacity: .8; font-size: 12px; }
section, nav { margin: 10px 18px; }
h2 { font-size: 14px; margin: 6px 0; }
.warnings { background: #fff8e1; border: 1px solid #ffe082; padding: 6px 10px; font-size: 12px; }
.curves { display: flex; flex-wrap: wrap; gap: 8px; }
svg.curve { background: #fff; border: 1px solid var(--line); }
svg.curve .ctitle { font-size: 11px; font-weight: 600; } svg.curve .frame { fill: none; stroke: #eee; }
svg.curve .ylab { font-size: 9px; text-anchor: end; fill: #666; }
svg.curve .xlab { font-size: 9px; fill: #666; } svg.curve .xlab.end { text-anchor: end; }
svg.curve .series { fill: none; stroke: #1e88e5; stroke-width: 1.6; } svg.curve circle { fill: #1e88e5; }
svg.curve .step-marker { stroke: #e53935; stroke-width: 1.2; stroke-dasharray: 3 2; }
nav#controls { position: sticky; top: 0; z-index: 5; background: #fff; border: 1px solid var(--line);
  padding: 6px 10px; display: flex; flex-wrap: wrap; gap: 12px; align-items: center; }
nav#controls select, nav#controls button { font: inherit; }
#shown { color: #555; margin-left: auto; }
.summary { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; background: #fff;
  border: 1px solid var(--line); padding: 8px 12px; }
.summary .headline { flex-basis: 100%; font-weight: 600; }
svg.hist .bar { fill: #5c6bc0; } svg.hist text { font-size: 10px; text-anchor: middle; }
table.strata { border-collapse: collapse; } table.strata td, table.strata th { border-bottom: 1px solid #eee;
  padding: 2px 10px; text-align: right; } table.strata th:first-child, table.strata td:first-child { text-align: left; }
.mass-wrap { overflow-x: auto; } table.mass { border-collapse: collapse; background: #fff; font-size: 12px; }
table.mass td, table.mass th { border: 1px solid #eee; padding: 1px 6px; text-align: right; }
table.mass td.pos { color: var(--pos); } table.mass td.neg { color: var(--neg); } table.mass td.zero { color: var(--zero); }
article.group { background: #fff; border: 1px solid var(--line); border-radius: 4px; margin: 10px 0; }
article.group > header { padding: 6px 10px; border-bottom: 1px solid var(--line); background: #f5f7fa; }
article.group .pid { font-family: ui-monospace, monospace; color: #555; margin-right: 8px; }
article.group .question { font-weight: 600; } article.group .gold { color: var(--answer-b); margin-left: 10px; }
article.group .gstats { color: #555; margin-left: 10px; }
.badge { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 11px; margin-left: 6px; }
.badge.novar { background: #fff3cd; border: 1px solid #f0c36d; }
details.sample { border-top: 1px solid #eee; padding: 4px 10px; border-left: 4px solid transparent; }
details.sample.sign-pos { border-left-color: var(--pos); } details.sample.sign-neg { border-left-color: var(--neg); }
details.sample > summary { cursor: pointer; list-style-position: inside; }
details.sample > summary > span { margin-right: 10px; }
.stratum-badge { font-family: ui-monospace, monospace; padding: 0 6px; border-radius: 3px; color: #fff; }
.s0 { background: #78909c; } .s1 { background: #1e88e5; } .s2 { background: #8e24aa; } .s3 { background: #00897b; }
.s4 { background: #f4511e; } .s5 { background: #6d4c41; } .s6 { background: #3949ab; } .s7 { background: #c0ca33; }
.adv { font-family: ui-monospace, monospace; font-weight: 600; }
.adv-pos { color: var(--pos); } .adv-neg { color: var(--neg); } .adv-zero, .adv-none { color: var(--zero); }
.term { font-family: ui-monospace, monospace; color: #555; }
.flag { color: var(--invalid-b); }
.turns { margin: 4px 0 6px 14px; }
.turn { border-left: 4px solid #999; margin: 5px 0; padding: 3px 8px; background: #fcfcfc; }
.turn-search { border-color: var(--search-b); } .turn-code { border-color: var(--code-b); }
.turn-answer { border-color: var(--answer-b); } .turn-invalid, .turn-none { border-color: var(--invalid-b); }
.thead { font-size: 11px; color: #555; } .thead .kind { font-weight: 700; text-transform: uppercase; }
.seg { white-space: pre-wrap; word-break: break-word; margin: 3px 0; padding: 3px 6px; border-radius: 3px;
  font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
.seg-think { background: var(--think); border-left: 3px solid var(--think-b); font-style: italic; }
.turn-search .seg-action { background: var(--search); } .turn-code .seg-action { background: var(--code); }
.turn-answer .seg-action { background: var(--answer); }
.turn-invalid .seg-action, .turn-none .seg-action { background: var(--invalid); }
.seg-passages { background: #f1f8ff; border: 1px dashed var(--search-b); }
.passage { margin: 2px 0; } .passage .title { font-weight: 700; }
.seg-result { background: #fffaf2; border: 1px dashed var(--code-b); }
.seg-feedback { background: #fff5f5; border: 1px dashed var(--invalid-b); }
.cut { font-size: 11px; color: #888; }
.legend span { margin-right: 10px; } .legend i { display: inline-block; width: 12px; height: 12px;
  vertical-align: -2px; margin-right: 3px; border-radius: 2px; }
.hidden { display: none !important; }
"""

JS = r"""
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("rollout-data").textContent);
  var state = { index: 0, stratum: "all", reward: "all", novar: false };
  var EPS = 1e-12;

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      var v = attrs[k];
      if (v === null || v === undefined || v === false) return;
      if (k === "text") node.textContent = String(v);
      else if (k === "class") node.className = v;
      else node.setAttribute(k, String(v));
    });
    (children || []).forEach(function (c) {
      if (c === null || c === undefined) return;
      node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return node;
  }
  function svg(tag, attrs) {
    var node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    Object.keys(attrs).forEach(function (k) {
      if (k === "text") node.textContent = String(attrs[k]); else node.setAttribute(k, String(attrs[k]));
    });
    return node;
  }
  function isNum(v) { return typeof v === "number" && isFinite(v); }
  function fmt(v, d) { return isNum(v) ? v.toFixed(d === undefined ? 3 : d) : "n/a"; }
  function signed(v) {
    if (!isNum(v)) return "n/a";
    return (v > EPS ? "+" : v < -EPS ? "\u2212" : "\u00b1") + Math.abs(v).toFixed(3);
  }
  function signClass(v) { return !isNum(v) ? "adv-none" : v > EPS ? "adv-pos" : v < -EPS ? "adv-neg" : "adv-zero"; }
  function stratumClass(s) { return "stratum-badge s" + (((s % 8) + 8) % 8); }
  function attr(v) { return isNum(v) ? String(v) : ""; }

  function stepLabel(st) {
    return st.phase + " \u00b7 step " + st.step + " (" + st.groups.length + " groups)";
  }

  function renderSelector() {
    var sel = document.getElementById("step-select");
    DATA.steps.forEach(function (st, i) { sel.appendChild(el("option", { value: i, text: stepLabel(st) })); });
    sel.addEventListener("change", function () { selectStep(Number(sel.value)); });
    document.getElementById("prev").addEventListener("click", function () { selectStep(state.index - 1); });
    document.getElementById("next").addEventListener("click", function () { selectStep(state.index + 1); });
    document.getElementById("filter-stratum").addEventListener("change", function (e) {
      state.stratum = e.target.value; applyFilters(); });
    document.getElementById("filter-reward").addEventListener("change", function (e) {
      state.reward = e.target.value; applyFilters(); });
    document.getElementById("filter-novar").addEventListener("change", function (e) {
      state.novar = e.target.checked; applyFilters(); });
    document.getElementById("expand").addEventListener("click", function () { setOpen(true); });
    document.getElementById("collapse").addEventListener("click", function () { setOpen(false); });
    document.addEventListener("keydown", function (e) {
      if (e.target && /SELECT|INPUT/.test(e.target.tagName)) return;
      if (e.key === "ArrowLeft") selectStep(state.index - 1);
      if (e.key === "ArrowRight") selectStep(state.index + 1);
    });
  }

  function setOpen(open) {
    Array.prototype.forEach.call(document.querySelectorAll("details.sample"), function (d) { d.open = open; });
  }

  function histogram(strata) {
    var w = Math.max(160, 46 * strata.length + 20), h = 120, top = 16, bottom = 30;
    var root = svg("svg", { "class": "hist", width: w, height: h, viewBox: "0 0 " + w + " " + h });
    var max = Math.max.apply(null, strata.map(function (s) { return s.count; }).concat([1]));
    strata.forEach(function (s, i) {
      var bh = (h - top - bottom) * s.count / max, x = 14 + i * 46;
      var bar = svg("rect", { "class": "bar", x: x, y: h - bottom - bh, width: 32, height: bh,
        "data-stratum": s.stratum, "data-count": s.count });
      bar.appendChild(svg("title", { text: s.label + ": " + s.count + " samples" }));
      root.appendChild(bar);
      root.appendChild(svg("text", { x: x + 16, y: h - bottom - bh - 3, text: s.count }));
      root.appendChild(svg("text", { x: x + 16, y: h - bottom + 13, text: s.stratum }));
    });
    root.appendChild(svg("text", { x: w / 2, y: h - 3, text: "stratum (samples per stratum)" }));
    return root;
  }

  function renderSummary(st) {
    var box = document.getElementById("step-summary");
    box.textContent = "";
    var groupsNote = st.groups.length < st.total_groups ? " (of " + st.total_groups + ")" : "";
    var head = el("div", { "class": "headline", text: st.phase + " \u00b7 step " + st.step + ": " +
      st.groups.length + " groups" + groupsNote + ", " + st.n_samples + " samples, mean reward " +
      fmt(st.reward_mean) + ", " + st.no_variance_groups + " without reward variance" });
    var rows = st.strata.map(function (s) {
      return el("tr", { "data-stratum": s.stratum }, [
        el("td", {}, [el("span", { "class": stratumClass(s.stratum), text: s.label })]),
        el("td", { "class": "count", text: s.count }),
        el("td", { "class": "reward-mean", text: fmt(s.reward_mean) }),
        el("td", { "class": "adv " + signClass(s.advantage_mean), text: signed(s.advantage_mean) })]);
    });
    var table = el("table", { "class": "strata" }, [
      el("tr", {}, [el("th", { text: "stratum" }), el("th", { text: "samples" }), el("th", { text: "mean reward" }),
        el("th", { text: "mean advantage" })])].concat(rows));
    var legend = el("div", { "class": "legend" }, [["think", "var(--think-b)"], ["search + passages",
      "var(--search-b)"], ["code + result", "var(--code-b)"], ["answer", "var(--answer-b)"],
      ["invalid / no action", "var(--invalid-b)"]].map(function (p) {
        return el("span", {}, [el("i", { style: "background:" + p[1] }), p[0]]); }));
    box.appendChild(el("div", { "class": "summary" }, [head, histogram(st.strata), table, legend]));
  }

  function segment(cls, text) { return el("div", { "class": "seg " + cls, text: text }); }

  function renderTurn(t, k) {
    var bits = ["turn " + (k + 1), " \u00b7 ", el("span", { "class": "kind", text: t.kind }),
      " \u00b7 " + t.tokens + " tokens"];
    if (t.query) bits.push(" \u00b7 " + (t.kind === "answer" ? "answer: " : "query: ") + t.query.slice(0, 80));
    if (isNum(t.adv_mean)) {
      bits.push(" \u00b7 token advantage ");
      bits.push(el("span", { "class": "adv " + signClass(t.adv_mean), text: signed(t.adv_mean) }));
    }
    if (isNum(t.calib_score) && t.kind === "search") bits.push(" \u00b7 CalibAdv s_t " + fmt(t.calib_score, 2));
    if (t.clipped) bits.push(el("span", { "class": "flag", text: " \u00b7 cut by max_len" }));
    var node = el("div", { "class": "turn turn-" + t.kind, "data-kind": t.kind, "data-turn": k,
      "data-adv-mean": attr(t.adv_mean) }, [el("div", { "class": "thead" }, bits)]);
    if (t.think) node.appendChild(segment("seg-think", t.think));
    if (t.action) node.appendChild(segment("seg-action", t.action));
    if (t.passages && t.passages.length) {
      node.appendChild(el("div", { "class": "seg seg-passages", "data-docs": t.passages.length },
        t.passages.map(function (p) {
          return el("div", { "class": "passage" }, [el("span", { "class": "title", text: "Doc " + p.rank + " \u00b7 " +
            p.title + ": " }), p.text]);
        })));
    } else if (t.output_text) {
      var cls = t.output_kind === "result" ? "seg-result" : t.output_kind === "information" ? "seg-passages" :
        "seg-feedback";
      node.appendChild(segment(cls, t.output_text));
    }
    if (t.output_chars > t.output_shown) node.appendChild(el("div", { "class": "cut", text: "tool output cut at " +
      t.output_shown + " of " + t.output_chars + " characters (" + t.output_tokens + " tokens)" }));
    return node;
  }

  function renderSample(s) {
    var adv = s.advantage;
    var head = [
      el("span", { "class": stratumClass(s.stratum), text: s.stratum_label }),
      el("span", { "class": "reward", text: "reward " + fmt(s.reward) }),
      el("span", { text: "EM " + fmt(s.em, 2) + " \u00b7 F1 " + fmt(s.f1, 2) }),
      el("span", { "class": "adv " + signClass(adv), text: "A " + signed(adv) }),
      el("span", { "class": "term san", text: "SAN " + signed(s.san) }),
      el("span", { "class": "term gn", text: "GN " + signed(s.gn) }),
      el("span", { "class": "term", text: s.action_tokens + " action / " + s.total_tokens + " tokens" })];
    if (s.sapo && isNum(s.sapo.penalized_share))
      head.push(el("span", { "class": "term", text: "SAPO penalized " + fmt(100 * s.sapo.penalized_share, 1) + "%" }));
    if (s.truncated) head.push(el("span", { "class": "flag", text: "truncated" }));
    if (s.invalid_actions) head.push(el("span", { "class": "flag", text: s.invalid_actions + " invalid" }));
    if (s.tool_errors) head.push(el("span", { "class": "flag", text: s.tool_errors + " tool errors" }));
    return el("details", { "class": "sample sign-" + signClass(adv).slice(4), open: "", "data-sample": s.sample,
      "data-stratum": s.stratum, "data-reward": attr(s.reward), "data-advantage": attr(adv),
      "data-san": attr(s.san), "data-gn": attr(s.gn) }, [
      el("summary", {}, head), el("div", { "class": "turns" }, s.turns.map(renderTurn))]);
  }

  function renderGroup(g) {
    var head = el("header", {}, [
      el("span", { "class": "pid", text: (g.dataset ? g.dataset + " \u00b7 " : "") + g.prompt_id }),
      el("span", { "class": "question", text: g.question }),
      el("span", { "class": "gold", text: "gold: " + g.golds.join(" | ") }),
      el("span", { "class": "gstats", text: "mean reward " + fmt(g.reward_mean) + " \u00b7 strata " +
        g.strata.join(", ") }),
      g.no_variance ? el("span", { "class": "badge novar", text: "no reward variance" }) : null]);
    return el("article", { "class": "group", "data-group": g.group, "data-prompt-id": g.prompt_id,
      "data-no-variance": g.no_variance ? "1" : "0" }, [head].concat(g.samples.map(renderSample)));
  }

  function renderFilters(st) {
    var sel = document.getElementById("filter-stratum");
    sel.textContent = "";
    sel.appendChild(el("option", { value: "all", text: "all" }));
    st.strata.forEach(function (s) { sel.appendChild(el("option", { value: s.stratum, text: s.label })); });
    if (!st.strata.some(function (s) { return String(s.stratum) === state.stratum; })) state.stratum = "all";
    sel.value = state.stratum;
  }

  function rewardOk(r) {
    if (state.reward === "all") return true;
    if (!isNum(r)) return false;
    return state.reward === "pos" ? r > EPS : state.reward === "neg" ? r < -EPS : Math.abs(r) <= EPS;
  }

  function applyFilters() {
    var groups = 0, samples = 0;
    Array.prototype.forEach.call(document.querySelectorAll("article.group"), function (g) {
      var visible = 0;
      Array.prototype.forEach.call(g.querySelectorAll("details.sample"), function (s) {
        var ok = (state.stratum === "all" || s.getAttribute("data-stratum") === state.stratum) &&
          rewardOk(s.getAttribute("data-reward") === "" ? null : Number(s.getAttribute("data-reward")));
        s.classList.toggle("hidden", !ok);
        if (ok) visible++;
      });
      var show = visible > 0 && (!state.novar || g.getAttribute("data-no-variance") === "1");
      g.classList.toggle("hidden", !show);
      if (show) { groups++; samples += visible; }
    });
    var shown = document.getElementById("shown");
    shown.textContent = "showing " + groups + " groups, " + samples + " samples";
    shown.setAttribute("data-groups", groups);
    shown.setAttribute("data-samples", samples);
  }

  function moveMarkers(st) {
    Array.prototype.forEach.call(document.querySelectorAll("svg.curve"), function (c) {
      var lo = Number(c.getAttribute("data-smin")), hi = Number(c.getAttribute("data-smax"));
      var x0 = Number(c.getAttribute("data-x0")), x1 = Number(c.getAttribute("data-x1"));
      var x = st.phase === "train" && st.step >= lo && st.step <= hi ? x0 + (st.step - lo) / (hi - lo) * (x1 - x0) : -10;
      var m = c.querySelector(".step-marker");
      m.setAttribute("x1", x); m.setAttribute("x2", x);
    });
  }

  function selectStep(i) {
    if (!DATA.steps.length) return;
    i = Math.max(0, Math.min(DATA.steps.length - 1, i));
    state.index = i;
    var st = DATA.steps[i];
    document.getElementById("step-select").value = String(i);
    document.body.setAttribute("data-step-key", st.key);
    renderSummary(st);
    renderFilters(st);
    var box = document.getElementById("groups");
    box.textContent = "";
    st.groups.forEach(function (g) { box.appendChild(renderGroup(g)); });
    applyFilters();
    moveMarkers(st);
    if (window.history && window.history.replaceState) window.history.replaceState(null, "", "#" + st.key);
  }

  renderSelector();
  var wanted = decodeURIComponent((window.location.hash || "").slice(1));
  var start = DATA.steps.findIndex(function (st) { return st.key === wanted; });
  selectStep(start >= 0 ? start : 0);
  document.body.setAttribute("data-rendered", "1");
})();
"""

ERROR_HOOK = ("window.__reportErrors = [];"
              "window.addEventListener('error', function (e) { window.__reportErrors.push(String(e.message)); });")


def embed_json(data) -> str:
    """JSON safe inside a <script> element: no '<', '>' or '&' survives literally."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(view: dict, curves_svg: str, generated: str, mechanism_table: str = "") -> str:
    """The whole report; ``view`` is :func:`openrlhf_sgrpo.inspect.view.run_view`'s output,
    ``mechanism_table`` :func:`openrlhf_sgrpo.inspect.mechanism.mechanism_html`'s (after the curves)."""
    run = escape(view["run"])
    n_groups = sum(len(s["groups"]) for s in view["steps"])
    warnings = "".join(f"<li>{escape(w)}</li>" for w in view["warnings"])
    warn_html = f'<section class="warnings" id="warnings"><ul>{warnings}</ul></section>' if warnings else ""
    curves_html = (f'<section id="curves"><h2>Headline curves (metrics.jsonl, train; dashed line: selected step)</h2>'
                   f'<div class="curves">{curves_svg}</div></section>') if curves_svg else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Rollouts · {run}</title><style>{CSS}</style><script>{ERROR_HOOK}</script></head>
<body>
<header class="top"><h1>Rollout inspector · {run}</h1>
<div class="sub">{len(view["steps"])} steps, {n_groups} prompt groups · generated {escape(generated)} by
python -m openrlhf_sgrpo.inspect</div></header>
{warn_html}{curves_html}{mechanism_table}
<nav id="controls"><button id="prev" title="previous step (←)">◀</button><select id="step-select"></select>
<button id="next" title="next step (→)">▶</button>
<label>stratum <select id="filter-stratum"></select></label>
<label>reward <select id="filter-reward"><option value="all">all</option><option value="pos">&gt; 0</option>
<option value="zero">= 0</option><option value="neg">&lt; 0</option></select></label>
<label><input type="checkbox" id="filter-novar"> only groups without reward variance</label>
<button id="expand">expand all</button><button id="collapse">collapse all</button>
<span id="shown"></span></nav>
<section id="step-summary"></section>
<section id="groups"></section>
<script id="rollout-data" type="application/json">{embed_json(view)}</script>
<script>{JS}</script>
</body></html>
"""
