"""``python -m openrlhf_sgrpo.inspect RUN_DIR [--out report.html]``: the rollout inspector.

Reads ``RUN_DIR/rollouts/<phase>/step_*.jsonl`` (written by the trainer, the eval CLI, the demo
or the cluster's ``--sgrpo.dump_rollouts``) and ``RUN_DIR/metrics.jsonl``, and writes one
self-contained HTML file: per step the strata histogram and mean reward per stratum; per
prompt group its samples sorted by stratum, turns colour-coded, reward and advantages with
their sign; filters; a step selector; the headline curves. It opens offline.
"""

from __future__ import annotations

import argparse
import sys

from openrlhf_sgrpo.inspect.load import InspectError
from openrlhf_sgrpo.inspect.report import DEFAULT_OUT, write_report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m openrlhf_sgrpo.inspect", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="the run folder (holds rollouts/ and metrics.jsonl)")
    p.add_argument("--out", default=None, help=f"HTML file to write (default RUN_DIR/{DEFAULT_OUT})")
    p.add_argument("--max-steps", type=int, default=200,
                   help="at most this many train steps, evenly spaced (keeps the file small on long runs)")
    p.add_argument("--max-groups", type=int, default=64, help="at most this many prompt groups per step")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    for name in ("max_steps", "max_groups"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        path, warnings = write_report(args.run_dir, args.out, args.max_steps, args.max_groups,
                                      progress=not args.quiet)
    except InspectError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    size = path.stat().st_size
    print(f"wrote {path} ({size / 1024:.0f} KiB); open it in a browser (works offline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
