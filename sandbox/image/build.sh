#!/usr/bin/env bash
# Build the sandbox image with no registry access: debootstrap a minimal Debian rootfs from the
# Debian mirror, cache it as a tarball, then `docker import` it. Idempotent: an existing image
# is kept unless FORCE=1; a cached tarball skips debootstrap.
#   env: SANDBOX_IMAGE (sgrpo-sandbox:latest), SGRPO_CACHE (~/.cache/openrlhf-sgrpo),
#        DEBIAN_SUITE (bookworm), DEBIAN_MIRROR (http://deb.debian.org/debian),
#        EXTRA_PACKAGES (comma list, e.g. python3-numpy), FORCE (1 to rebuild)
set -euo pipefail
IMAGE="${SANDBOX_IMAGE:-sgrpo-sandbox:latest}"
CACHE="${SGRPO_CACHE:-$HOME/.cache/openrlhf-sgrpo}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3-minimal,python3${EXTRA_PACKAGES:+,$EXTRA_PACKAGES}"
TAG="$(echo "$SUITE-$PACKAGES" | md5sum | cut -c1-12)"
TARBALL="$CACHE/sandbox-rootfs-$SUITE-$TAG.tar"

if [ -z "${FORCE:-}" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "build.sh: image $IMAGE already present (FORCE=1 rebuilds)"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "build.sh: debootstrap not installed" >&2; exit 1; }
mkdir -p "$CACHE"
if [ ! -s "$TARBALL" ] || [ -n "${FORCE:-}" ]; then
  ROOT="$(mktemp -d /tmp/sgrpo-rootfs.XXXXXX)"
  trap 'rm -rf "$ROOT"' EXIT
  echo "build.sh: debootstrap $SUITE ($PACKAGES) into $ROOT"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR"
  rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc \
         "$ROOT"/usr/share/man "$ROOT"/usr/share/locale
  mkdir -p "$ROOT/work"
  chmod 1777 "$ROOT/work"
  tar --numeric-owner -C "$ROOT" -cf "$TARBALL.tmp" .
  mv "$TARBALL.tmp" "$TARBALL"
fi
echo "build.sh: importing $TARBALL as $IMAGE"
docker import \
  --change 'USER 65534:65534' \
  --change 'WORKDIR /work' \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin HOME=/work LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1' \
  --change 'CMD ["sleep", "infinity"]' \
  "$TARBALL" "$IMAGE"
docker image inspect "$IMAGE" --format 'build.sh: built {{.Id}} ({{.Size}} bytes)'
