"""The rollout inspector: run folder -> one self-contained HTML report (``python -m openrlhf_sgrpo.inspect``).

- :mod:`.load`    read ``rollouts/`` and ``metrics.jsonl``, with errors that name the file and line
- :mod:`.view`    per-step strata summaries, display-ready turns (think, passages, results)
- :mod:`.curves`  headline curves as inline SVG
- :mod:`.mechanism` the advantage mass per tool-call stratum and step, as a table
- :mod:`.page`    the HTML file (inline CSS/JS, data embedded as JSON)
- :mod:`.report`  ``write_report(run_dir, out)``: all of the above, written atomically (CLI, demo)
- :mod:`.browser` headless Chromium over the DevTools protocol: the tests' eyes, and screenshots
"""
