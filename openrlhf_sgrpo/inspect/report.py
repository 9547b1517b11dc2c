"""Run folder -> the HTML report file: the one call the CLI and the demo make."""

from __future__ import annotations

import os
import time
from pathlib import Path

from openrlhf_sgrpo.inspect.curves import curves_html
from openrlhf_sgrpo.inspect.load import InspectError, load_run
from openrlhf_sgrpo.inspect.mechanism import mechanism_html
from openrlhf_sgrpo.inspect.page import render_page
from openrlhf_sgrpo.inspect.view import run_view

DEFAULT_OUT = "rollouts.html"


def write_report(run_dir: str | Path, out: str | Path | None = None, max_steps: int | None = 200,
                 max_groups: int | None = 64, progress: bool = False) -> tuple[Path, list[str]]:
    """Build the report of ``run_dir`` and write it atomically; returns its path and the warnings
    (a skipped torn line, steps or groups left out) that the page also shows."""
    run = load_run(run_dir, max_steps=max_steps, max_groups=max_groups, progress=progress)
    html = render_page(run_view(run), curves_html(run.metrics), time.strftime("%Y-%m-%d %H:%M:%S"),
                       mechanism_html(run.metrics))
    path = Path(out) if out is not None else Path(run_dir) / DEFAULT_OUT
    if path.is_dir():
        raise InspectError(f"report path {path} is a folder; name the HTML file to write")
    if not path.parent.is_dir():
        raise InspectError(f"report path {path}: folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise InspectError(f"cannot write {path}: {err.strerror or err}") from None
    return path, run.warnings
