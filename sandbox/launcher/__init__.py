"""Build once and locate ``sgrpo-launch``, the local backend's root step (see sgrpo_launch.c).

It is compiled from the C file beside this one with the host's ``cc`` into the asset cache,
named after the source's hash so an edited source is rebuilt. Static when libc.a is there
(no dynamic loader at every run), else dynamic. With no compiler the backend keeps its shell
launcher (``sh`` + ``setpriv``): the same steps, ~4 ms more CPU per run.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("sgrpo_launch.c")


def cache_dir() -> Path:
    return Path(os.environ.get("SGRPO_CACHE", Path.home() / ".cache" / "openrlhf-sgrpo"))


def launcher_path() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return cache_dir() / f"sgrpo-launch-{digest}"


def _trusted(path: Path) -> bool:
    """Only we may have written it: root runs this file, so nobody else may be able to swap it."""
    for p in (path, path.parent):
        st = p.stat()
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return False
    return True


def build_launcher(cc: str | None = None) -> str | None:
    """Path of a built ``sgrpo-launch`` (building it now if needed), or None without a compiler
    or when the cache folder or file could have been written by another user."""
    target = launcher_path()
    if target.exists():
        if not _trusted(target):
            log.warning("%s or its folder is writable by others or not ours: not running it; "
                        "the local backend uses its shell launcher", target)
            return None
        if os.access(target, os.X_OK):
            return str(target)
    cc = cc or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.info("no C compiler: the local backend uses its shell launcher")
        return None
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    if not _trusted(target.parent):
        log.warning("%s is writable by others or not ours: not building sgrpo-launch there", target.parent)
        return None
    tmp = target.with_name(f"{target.name}.part{os.getpid()}")
    errors = []
    for extra in (["-static"], []):
        proc = subprocess.run([cc, "-O2", "-Wall", *extra, "-o", str(tmp), str(SOURCE)],
                              capture_output=True, text=True)
        if proc.returncode == 0:
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)  # atomic: a concurrent builder may have won, same bytes
            return str(target)
        errors.append(proc.stderr.strip()[-300:])
    log.warning("could not build sgrpo-launch (%s); the local backend uses its shell launcher", errors)
    return None
