#!/usr/bin/env bash
# The README's picture, docs/img/inspector_demo.png, from a `make demo` run's rollout inspector:
#   scripts/readme_picture.sh runs/<id> [STEP] [OUT]
# rebuilds RUN/rollouts.html from the run's records (python -m openrlhf_sgrpo.inspect), opens it in
# headless Chromium (chromium-headless-shell or chromium; $SGRPO_CHROMIUM names another) at 880 px,
# the width GitHub renders a README's images at, so that the picture is shown 1:1 and its numbers read
# there; selects training step STEP (default 3) and writes the top HEIGHT px (default 1750) to OUT.
# ZOOM (default 1.15) scales the page's text up for the same width. Exits non-zero when the page
# logged a script error or the step does not exist.
set -euo pipefail
cd "$(dirname "$0")/.."
source examples/lib/python.sh
PYTHON="$(default_python)"
RUN="${1:?usage: scripts/readme_picture.sh RUN_DIR [STEP] [OUT]}"
STEP="${2:-3}"
OUT="${3:-docs/img/inspector_demo.png}"
HEIGHT="${HEIGHT:-1750}"
ZOOM="${ZOOM:-1.15}"
[ -d "$RUN" ] || { echo "error: RUN_DIR $RUN is not a folder" >&2; exit 2; }
[[ "$STEP" =~ ^[0-9]+$ ]] || { echo "error: STEP must be a training step number, got $STEP" >&2; exit 2; }
"$PYTHON" -m openrlhf_sgrpo.inspect "$RUN"
select_step="(() => {
  document.body.style.zoom = '$ZOOM';
  const s = document.getElementById('step-select');
  const o = [...s.options].find(o => /^train · step $STEP \\(/.test(o.text));
  if (!o) throw new Error('no training step $STEP in this report: ' + [...s.options].map(o => o.text).join(', '));
  s.value = o.value;
  s.dispatchEvent(new Event('change'));
})()"
"$PYTHON" -m openrlhf_sgrpo.inspect.browser "$RUN/rollouts.html" --width 880 --height "$HEIGHT" \
  --eval "$select_step" --screenshot "$OUT"
