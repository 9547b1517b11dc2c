"""Start the sandboxed ``main.py`` without the ``site`` module, keeping what code relies on.

Why: ``site`` is ~5 ms of the interpreter's start-up on 2 busy cores (it scans the
site-packages dirs, runs every ``.pth`` hook the host has installed, imports ``os`` and
sitecustomize), ~15% of a ``print(1)`` run. The local backend runs
``python3 -E -s -S -c BOOT main.py`` instead, where BOOT restores, cheaply:

* the host's site-packages dirs on ``sys.path`` (probed once at start-up, ``.pth`` path lines
  included), so installed packages import as before;
* the ``exit``, ``quit`` and ``help`` builtins that model-written code calls;
* ``python main.py`` semantics: ``sys.argv == ['main.py']``, ``sys.path[0]`` is the script's
  folder, ``__name__ == '__main__'``, ``__file__``, and tracebacks that start at ``main.py``.

Left out on purpose: ``.pth`` *import* lines (host hooks, not the code's business) and
sitecustomize/usercustomize.
"""

from __future__ import annotations

import json
import subprocess

_PATH_PROBE = "import json, sys; print(json.dumps(sys.path))"

BOOT_TEMPLATE = r'''import sys, builtins
class _Quitter:
    def __init__(self, name): self.name = name
    def __repr__(self): return "Use " + self.name + "() or Ctrl-D (i.e. EOF) to exit"
    def __call__(self, code=None):
        try: sys.stdin.close()
        except Exception: pass
        raise SystemExit(code)
class _Helper:
    def __repr__(self): return "Type help() for interactive help, or help(object) for help about object."
    def __call__(self, *args, **kwds):
        import pydoc
        return pydoc.help(*args, **kwds)
builtins.exit, builtins.quit, builtins.help = _Quitter("exit"), _Quitter("quit"), _Helper()
def _excepthook(kind, value, tb, _show=sys.excepthook):
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    if isinstance(value, BaseException):
        value.__traceback__ = tb  # the display reads the exception's own traceback
    _show(kind, value, tb)
sys.excepthook = _excepthook
del sys.argv[0], _Quitter, _Helper, _excepthook
sys.path[0] = %(workdir)r
sys.path.extend(%(site_dirs)r)
__file__, __cached__ = %(script)r, None
__loader__ = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", __file__)
import posix
_fd = posix.open(__file__, posix.O_RDONLY)
_code = compile(posix.read(_fd, posix.fstat(_fd).st_size + 1), __file__, "exec")
posix.close(_fd)
del sys, builtins, posix, _fd
exec(globals().pop("_code"))
'''


def site_dirs(python: str, roots: tuple[str, ...]) -> list[str]:
    """The sys.path entries that ``site`` adds for ``python`` (``.pth`` path lines included),
    limited to those under ``roots`` (what the sandbox mounts)."""
    def path(*flags: str) -> list[str]:
        out = subprocess.run([python, *flags, "-c", _PATH_PROBE], capture_output=True, text=True,
                             timeout=60, check=True)
        return json.loads(out.stdout)

    bare = set(path("-E", "-s", "-S"))
    return [d for d in path("-E", "-s") if d and d not in bare and d.startswith(roots)]


def boot_source(workdir: str, script: str, dirs: list[str]) -> str:
    """The ``-c`` program that runs ``workdir/script`` as ``python script`` would."""
    return BOOT_TEMPLATE % {"workdir": workdir, "site_dirs": dirs, "script": f"{workdir}/{script}"}
