#!/usr/bin/env bash
# Docker engine for CI and the sandbox Docker tests, without touching host networking.
#   scripts/docker_ci.sh install      apt-get install docker.io debootstrap bubblewrap (idempotent)
#   scripts/docker_ci.sh start        dockerd --bridge=none --iptables=false --ip6tables=false with its
#                                     own data-root ($DATA) and unix socket; writes $STATE/env
#   scripts/docker_ci.sh build-image  offline image build (sandbox/image/build.sh; its status: 3 = the
#                                     host lacks a piece, any other failure is an error to fix)
#   scripts/docker_ci.sh stop         stop that dockerd by PID and remove its temp state
# $STATE (default /tmp/sgrpo-docker, env SGRPO_DOCKER_DIR) holds env, dockerd.pid, dockerd.log.
# `source $STATE/env` exports DOCKER_HOST; the tests read the same file when DOCKER_HOST is unset.
# $DATA (env SGRPO_DOCKER_DATA; default: the docker/ folder of the asset cache, $SGRPO_CACHE or
# ~/.cache/openrlhf-sgrpo) is the engine's data-root, kept between runs as a developer's engine
# keeps its images: an unchanged Dockerfile step then comes from the layer cache (on a 2-core AVX2
# EPYC the compose and train-image builds took 232 s and 206 s of a test run from scratch). `start`
# drops what a run leaves behind (stopped containers, images no tag names); SGRPO_DOCKER_DATA=temp
# gives a data-root under $STATE, removed by `stop`: every image built from scratch.
set -euo pipefail
STATE="${SGRPO_DOCKER_DIR:-/tmp/sgrpo-docker}"
DATA="${SGRPO_DOCKER_DATA:-${SGRPO_CACHE:-$HOME/.cache/openrlhf-sgrpo}/docker}"
[ "$DATA" = temp ] && DATA="$STATE/data"
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

# dockerd on $DATA; 0 once it answers, 1 when it exits or stays silent for a minute.
launch() {
  local sock="$STATE/d.sock"
  setsid dockerd --bridge=none --iptables=false --ip6tables=false \
    --data-root "$DATA" --exec-root "$STATE/exec" --pidfile "$STATE/dockerd.pidfile" \
    -H "unix://$sock" >"$STATE/dockerd.log" 2>&1 < /dev/null &
  echo $! > "$STATE/dockerd.pid"
  for _ in $(seq 1 60); do
    if DOCKER_HOST="unix://$sock" docker version >/dev/null 2>&1; then
      printf 'export DOCKER_HOST=unix://%s\nexport DOCKERD_PID=%s\n' "$sock" "$(cat "$STATE/dockerd.pid")" > "$STATE/env"
      return 0
    fi
    running || break
    sleep 1
  done
  return 1
}

give_up() {
  echo "docker_ci.sh: $1; last log lines:" >&2
  tail -n 20 "$STATE/dockerd.log" >&2 || true
  cmd_stop
  exit 1
}

cmd_start() {
  need_root start
  if running; then echo "docker_ci.sh: dockerd already running (pid $(cat "$STATE/dockerd.pid"))"; return 0; fi
  command -v dockerd >/dev/null || { echo "docker_ci.sh: dockerd not installed (run install)" >&2; exit 1; }
  mkdir -p "$STATE/exec" "$DATA"
  if ! launch; then
    if [ "$DATA" = "$STATE/data" ] || [ -z "$(ls -A "$DATA")" ]; then
      give_up "dockerd failed to start"
    fi
    # a data-root a killed engine left unusable costs a rebuild, not the run
    echo "docker_ci.sh: dockerd did not start on the kept data-root $DATA; starting it empty" >&2
    tail -n 5 "$STATE/dockerd.log" >&2 || true
    stop_engine
    unmount_under "$DATA"
    rm -rf "$DATA" && mkdir -p "$DATA"
    launch || give_up "dockerd failed to start on an empty data-root"
  fi
  source "$STATE/env"
  docker container prune -f >/dev/null || true  # left by a killed run
  docker image prune -f >/dev/null || true      # untagged: earlier builds of a tag since rebuilt
  echo "docker_ci.sh: dockerd up (pid $(cat "$STATE/dockerd.pid"), data-root $DATA, $(docker images -q | wc -l) images kept); source $STATE/env"
}

cmd_build_image() {
  [ -s "$STATE/env" ] && source "$STATE/env"
  "$HERE/sandbox/image/build.sh"
}

stop_engine() {
  if [ -s "$STATE/dockerd.pid" ]; then
    local pid; pid="$(cat "$STATE/dockerd.pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    echo "docker_ci.sh: dockerd (pid $pid) stopped"
    rm -f "$STATE/dockerd.pid"
  fi
}

# dockerd unmounts on a clean exit; this catches what a killed or failed one left mounted at $1
# (it bind-mounts its data-root onto itself) or below it.
unmount_under() {
  local m
  for m in $(awk -v root="$1" '$2 == root || index($2, root "/") == 1 {print $2}' /proc/self/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  return 0
}

cmd_stop() {
  stop_engine
  unmount_under "$DATA"
  unmount_under "$STATE"
  rm -rf "$STATE"
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  build-image) cmd_build_image ;;
  stop) cmd_stop ;;
  *) echo "usage: $0 install|start|build-image|stop" >&2; exit 2 ;;
esac
