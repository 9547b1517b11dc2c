#!/usr/bin/env bash
# Build the sandbox image with no registry access: debootstrap a minimal Debian rootfs from the
# Debian mirror, cache it as a tarball, then `docker import` it. Idempotent: an image this recipe
# made (its label sgrpo.recipe: the suite, the packages and this script) is kept unless FORCE=1,
# one from another recipe is rebuilt; a cached tarball skips debootstrap.
#   env: SANDBOX_IMAGE (sgrpo-sandbox:latest), SGRPO_CACHE (~/.cache/openrlhf-sgrpo),
#        DEBIAN_SUITE (bookworm), DEBIAN_MIRROR (http://deb.debian.org/debian),
#        EXTRA_PACKAGES (comma list, e.g. python3-numpy), FORCE (1 to rebuild)
# Exit status: 0 built or present; 3 the host lacks a piece, checked before any work (no docker
# CLI or engine, no debootstrap, not root, the mirror unreachable): the same meaning as
# `sandbox.serve`'s status 3, so callers may skip on it; 1 anything else (a bad DEBIAN_SUITE or
# DEBIAN_MIRROR, a failed debootstrap or import): an error to fix, never a reason to skip.
set -euo pipefail
IMAGE="${SANDBOX_IMAGE:-sgrpo-sandbox:latest}"
CACHE="${SGRPO_CACHE:-$HOME/.cache/openrlhf-sgrpo}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3-minimal,python3${EXTRA_PACKAGES:+,$EXTRA_PACKAGES}"
TAG="$(echo "$SUITE-$PACKAGES" | md5sum | cut -c1-12)"
TARBALL="$CACHE/sandbox-rootfs-$SUITE-$TAG.tar"
RECIPE="$TAG-$(md5sum < "${BASH_SOURCE[0]}" | cut -c1-12)"
EXIT_ENVIRONMENT=3

missing() { echo "build.sh: environment: $*" >&2; exit "$EXIT_ENVIRONMENT"; }
fail() { echo "build.sh: error: $*" >&2; exit 1; }

# The suite's Release file answers: reachable. A 4xx means the mirror is up but the suite or
# mirror path is wrong (a setting to fix); no answer or a 5xx means the mirror cannot be reached.
check_mirror() {
  local url="$MIRROR/dists/$SUITE/Release" out rc=0
  case "$MIRROR" in
    file://*) [ -r "${url#file://}" ] || fail "no $url (wrong DEBIAN_SUITE or DEBIAN_MIRROR?)"; return 0 ;;
    http://*|https://*) ;;
    *) fail "DEBIAN_MIRROR must be an http(s):// or file:// URL, got '$MIRROR'" ;;
  esac
  command -v wget >/dev/null || missing "wget not installed (debootstrap needs it; apt-get install wget)"
  out="$(wget -q -S --spider -T 20 -t 2 "$url" 2>&1)" || rc=$?
  [ "$rc" = 0 ] && return 0
  if [ "$rc" = 8 ] && grep -qE '^ *HTTP/[0-9.]+ 4[0-9][0-9]' <<<"$out"; then
    fail "the mirror answered $(grep -oE 'HTTP/[0-9.]+ 4[0-9][0-9]' <<<"$out" | tail -n 1) for $url" \
         "(wrong DEBIAN_SUITE or DEBIAN_MIRROR?)"
  fi
  missing "the Debian mirror cannot be reached: $url (wget status $rc)"
}

command -v docker >/dev/null || missing "no docker CLI (scripts/docker_ci.sh install)"
docker version >/dev/null 2>&1 || missing "no Docker engine answers at ${DOCKER_HOST:-the default socket} (scripts/docker_ci.sh start)"
if [ -z "${FORCE:-}" ]; then
  made_by="$(docker image inspect "$IMAGE" --format '{{index .Config.Labels "sgrpo.recipe"}}' 2>/dev/null || true)"
  if [ "$made_by" = "$RECIPE" ]; then
    echo "build.sh: image $IMAGE already present (FORCE=1 rebuilds)"
    exit 0
  fi
  [ -z "$made_by" ] || echo "build.sh: image $IMAGE was made by another recipe ($made_by, now $RECIPE): rebuilding"
fi
mkdir -p "$CACHE" || fail "cannot create the cache folder $CACHE"
if [ ! -s "$TARBALL" ] || [ -n "${FORCE:-}" ]; then
  command -v debootstrap >/dev/null || missing "debootstrap not installed (scripts/docker_ci.sh install)"
  [ "$(id -u)" = 0 ] || missing "debootstrap needs root"
  check_mirror
  ROOT="$(mktemp -d /tmp/sgrpo-rootfs.XXXXXX)"
  trap 'rm -rf "$ROOT"' EXIT
  echo "build.sh: debootstrap $SUITE ($PACKAGES) into $ROOT"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" \
    || fail "debootstrap $SUITE ($PACKAGES) from $MIRROR failed (see its log above)"
  rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc \
         "$ROOT"/usr/share/man "$ROOT"/usr/share/locale
  mkdir -p "$ROOT/work"
  chmod 1777 "$ROOT/work"
  tar --numeric-owner -C "$ROOT" -cf "$TARBALL.tmp" . || fail "could not write $TARBALL.tmp"
  mv "$TARBALL.tmp" "$TARBALL"
fi
echo "build.sh: importing $TARBALL as $IMAGE"
docker import \
  --change 'USER 65534:65534' \
  --change 'WORKDIR /work' \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin HOME=/work LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1' \
  --change 'CMD ["sleep", "infinity"]' \
  --change "LABEL sgrpo.recipe=$RECIPE" \
  "$TARBALL" "$IMAGE" || fail "docker import of $TARBALL failed"
docker image inspect "$IMAGE" --format 'build.sh: built {{.Id}} ({{.Size}} bytes)'
