#!/usr/bin/env bash
# Docker engine for CI and the sandbox Docker tests, without touching host networking.
#   scripts/docker_ci.sh install      apt-get install docker.io debootstrap bubblewrap (idempotent)
#   scripts/docker_ci.sh start        dockerd --bridge=none --iptables=false --ip6tables=false with a
#                                     temp data-root and unix socket; writes $STATE/env
#   scripts/docker_ci.sh build-image  offline image build (sandbox/image/build.sh; its status: 3 = the
#                                     host lacks a piece, any other failure is an error to fix)
#   scripts/docker_ci.sh stop         stop that dockerd by PID and remove its temp state
# $STATE (default /tmp/sgrpo-docker, env SGRPO_DOCKER_DIR) holds env, dockerd.pid, dockerd.log.
# `source $STATE/env` exports DOCKER_HOST; the tests read the same file when DOCKER_HOST is unset.
set -euo pipefail
STATE="${SGRPO_DOCKER_DIR:-/tmp/sgrpo-docker}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

need_root() { [ "$(id -u)" = 0 ] || { echo "docker_ci.sh: $1 needs root" >&2; exit 1; }; }

cmd_install() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v bwrap >/dev/null || missing+=(bubblewrap)
  if [ ${#missing[@]} -eq 0 ]; then echo "docker_ci.sh: all present"; return 0; fi
  need_root install
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" \
    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; }
}

running() { [ -s "$STATE/dockerd.pid" ] && kill -0 "$(cat "$STATE/dockerd.pid")" 2>/dev/null; }

cmd_start() {
  need_root start
  if running; then echo "docker_ci.sh: dockerd already running (pid $(cat "$STATE/dockerd.pid"))"; return 0; fi
  command -v dockerd >/dev/null || { echo "docker_ci.sh: dockerd not installed (run install)" >&2; exit 1; }
  mkdir -p "$STATE/data" "$STATE/exec"
  local sock="$STATE/d.sock"
  setsid dockerd --bridge=none --iptables=false --ip6tables=false \
    --data-root "$STATE/data" --exec-root "$STATE/exec" --pidfile "$STATE/dockerd.pidfile" \
    -H "unix://$sock" >"$STATE/dockerd.log" 2>&1 < /dev/null &
  echo $! > "$STATE/dockerd.pid"
  for _ in $(seq 1 60); do
    if DOCKER_HOST="unix://$sock" docker version >/dev/null 2>&1; then
      printf 'export DOCKER_HOST=unix://%s\nexport DOCKERD_PID=%s\n' "$sock" "$(cat "$STATE/dockerd.pid")" > "$STATE/env"
      echo "docker_ci.sh: dockerd up (pid $(cat "$STATE/dockerd.pid")); source $STATE/env"
      return 0
    fi
    running || break
    sleep 1
  done
  echo "docker_ci.sh: dockerd failed to start; last log lines:" >&2
  tail -n 20 "$STATE/dockerd.log" >&2 || true
  cmd_stop
  exit 1
}

cmd_build_image() {
  [ -s "$STATE/env" ] && source "$STATE/env"
  "$HERE/sandbox/image/build.sh"
}

cmd_stop() {
  if [ -s "$STATE/dockerd.pid" ]; then
    local pid; pid="$(cat "$STATE/dockerd.pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    echo "docker_ci.sh: dockerd (pid $pid) stopped"
  fi
  # dockerd unmounts on clean exit; this catches a killed one before deleting the state.
  if [ -d "$STATE" ]; then
    grep -o " $STATE/[^ ]*" /proc/self/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    rm -rf "$STATE"
  fi
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  build-image) cmd_build_image ;;
  stop) cmd_stop ;;
  *) echo "usage: $0 install|start|build-image|stop" >&2; exit 2 ;;
esac
