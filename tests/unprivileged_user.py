"""A throwaway user without root, for the tests that run what a newcomer runs on their own machine.

CI runs as root, and root hides what breaks for everyone else (setgroups, cgroups, files only root
can read). So the test makes a user of its own with a home and a copy of the checkout it owns, and
runs commands as that user from a fresh environment (no activated venv, no root's variables).

The interpreter may sit where that user cannot reach it (here the venv's python links into
/root/.pyenv, and /root is 0700). Rather than open such a folder to the world, each ancestor the
user could not traverse gets an ACL entry for the throwaway user's own group only (``setfacl -m
g:GROUP:x``), removed when the user is. ``make`` in the copy finds the checkout's venv through a
``.venv`` symlink, and the copy keeps the files' times, so ``make`` sees the venv as up to date and
installs nothing.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRESH_PATH = "/usr/local/bin:/usr/bin:/bin"  # a login shell's PATH: no venv on it


def missing_tools() -> str:
    """Why a throwaway user cannot be made here ('' when it can)."""
    if os.geteuid() != 0:
        return "needs root to create a throwaway user (as a user without root, run `make demo` yourself)"
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "setfacl", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install passwd acl util-linux)"
    return ""


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")


@dataclass
class ThrowawayUser:
    """A user and group named after this process, a home under ``base``, and the ACL grants made for it."""

    name: str
    home: Path
    uid: int = -1
    gid: int = -1
    granted: list[Path] = field(default_factory=list)

    @classmethod
    def create(cls, base: Path) -> ThrowawayUser:
        name = f"sgrpo-t{os.getpid()}"
        home = base / name
        _run("groupadd", name)
        try:
            _run("useradd", "--no-create-home", "--home-dir", str(home), "--gid", name, "--shell", "/bin/sh", name)
        except RuntimeError:
            _run("groupdel", name)
            raise
        entry = pwd.getpwnam(name)
        user = cls(name, home, entry.pw_uid, entry.pw_gid)
        home.mkdir(parents=True)
        os.chown(home, user.uid, user.gid)
        home.chmod(0o700)
        user.grant_path_to(home)
        return user

    def _can_traverse(self, d: Path) -> bool:
        st = d.stat()
        if st.st_uid == self.uid:
            return bool(st.st_mode & stat.S_IXUSR)
        return bool(st.st_mode & stat.S_IXOTH)

    def grant_path_to(self, target: Path) -> None:
        """Let this user reach ``target``: ``x`` for its group on every ancestor it cannot traverse."""
        for d in reversed([target, *target.parents]):
            if d.is_dir() and not self._can_traverse(d) and d not in self.granted:
                _run("setfacl", "-m", f"g:{self.name}:x", str(d))
                self.granted.append(d)

    def grant_interpreter(self, python: Path) -> None:
        """Every folder the venv's python reads at start-up: its link chain and the base install."""
        for p in (python, python.resolve(), Path(sys.base_prefix), Path(sys.prefix)):
            self.grant_path_to(p if p.is_dir() else p.parent)

    def copy_checkout(self, dest_name: str = "openrlhf-sgrpo") -> Path:
        """The checkout's tracked and unignored files, times kept, owned by the user; ``.venv`` links
        to the checkout's venv."""
        dest = self.home / dest_name
        files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.splitlines()
        for rel in files:
            src = ROOT / rel
            if not src.is_file() or src.is_symlink():
                continue
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)
        (dest / ".venv").symlink_to(ROOT / ".venv")
        for p in [dest, *dest.rglob("*")]:
            os.lchown(p, self.uid, self.gid)
        return dest

    def env(self, **extra: str) -> dict[str, str]:
        """A login shell's environment for this user: no VIRTUAL_ENV, no venv on PATH, its own HOME."""
        return {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, "PATH": FRESH_PATH,
                "LANG": "C.UTF-8", "SHELL": "/bin/sh", **extra}

    def command(self, argv: list[str]) -> list[str]:
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--", *argv]

    def run(self, argv: list[str], cwd: Path, timeout: float, **extra_env: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), cwd=cwd, env=self.env(**extra_env), capture_output=True,
                              text=True, timeout=timeout, check=False)

    def popen(self, argv: list[str], cwd: Path, **extra_env: str) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), cwd=cwd, env=self.env(**extra_env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def processes(self) -> list[int]:
        """Pids of this user's processes (only the test's own commands run as it)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid == self.uid:
                        pids.append(int(entry.name))
                except FileNotFoundError:
                    pass
        return pids

    def remove(self) -> None:
        """Kill what is left of its processes, drop the ACL entries, the user, its group and its home."""
        for _ in range(50):
            pids = self.processes()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        for d in reversed(self.granted):
            subprocess.run(["setfacl", "-x", f"g:{self.name}", str(d)], capture_output=True, check=False)
            listing = subprocess.run(["getfacl", "-c", "-p", str(d)], capture_output=True, text=True,
                                     check=False).stdout
            named = [line for line in listing.splitlines()
                     if line.startswith(("user:", "group:")) and line.split(":")[1]]
            if not named:  # no other named entry: drop the mask too, leaving the folder as it was
                subprocess.run(["setfacl", "-b", str(d)], capture_output=True, check=False)
        subprocess.run(["userdel", self.name], capture_output=True, check=False)
        subprocess.run(["groupdel", self.name], capture_output=True, check=False)
        shutil.rmtree(self.home, ignore_errors=True)
