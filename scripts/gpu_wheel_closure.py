"""Download a package set for the lent GPU machine: every wheel it needs that the machine's image lacks.

    python scripts/gpu_wheel_closure.py OUT_DIR --image-has FILE --leave-out NAMES REQ [REQ ...]

pip's own resolver cannot do this from here: it would resolve torch's exact CUDA wheels too
(the index lacks some), while the machine already has torch 2.11.0+cu130. So requirements are
followed one by one (``pip download --no-deps`` for Python 3.12 / manylinux x86-64), skipping
what the image holds (``--image-has``: one name a line) and what the run does not import
(``--leave-out``: comma-separated names, e.g. vLLM's optional kernel packages). ``NAME==VER``
roots are fetched first, so their pins win over later requirements (xgrammar 0.2.8 needs a newer
apache-tvm-ffi than vLLM 0.26.0 pins, so the set pins xgrammar==0.2.7).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (5, 17, 24, 26, 27, 28, 31, 34, 35)] + ["manylinux2014_x86_64",
                                                                                      "manylinux1_x86_64"]
MARKER_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_system": "Linux",
              "platform_machine": "x86_64", "sys_platform": "linux", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def download(spec: str, out: Path) -> Path:
    """The wheel of ``spec`` in ``out`` (each name is fetched once, so it is the only one there)."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *(x for p in PLATFORMS for x in ("--platform", p)), "-d", str(out), spec]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    name = canonicalize_name(Requirement(spec).name)
    return next(f for f in out.glob("*.whl") if canonicalize_name(f.name.split("-")[0]) == name)


def requirements(wheel: Path, extras: set[str]) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]
    return [r for r in reqs if r.marker is None
            or any(r.marker.evaluate({**MARKER_ENV, "extra": e}) for e in ["", *sorted(extras)])]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="an empty folder")
    p.add_argument("--image-has", type=Path, required=True)
    p.add_argument("--leave-out", default="")
    p.add_argument("--no-deps", default="", help="comma-separated roots whose requirements are not followed")
    p.add_argument("roots", nargs="+")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    skip = {canonicalize_name(n) for n in a.image_has.read_text().split() if n}
    skip |= {canonicalize_name(n) for n in a.leave_out.split(",") if n}
    no_deps = {canonicalize_name(n) for n in a.no_deps.split(",") if n}
    queue = [Requirement(r) for r in a.roots]  # roots first: their pins win over later requirements
    got: dict[str, Path] = {}
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in skip or name in got:
            continue
        spec = f"{req.name}{req.specifier}"
        try:
            got[name] = download(spec, a.out)
        except subprocess.CalledProcessError as err:
            print(f"cannot download {spec}: {err.stderr.strip().splitlines()[-1]}", file=sys.stderr)
            return 1
        if name not in no_deps:
            queue += requirements(got[name], set(req.extras))
    print(f"{len(got)} wheels, {sum(f.stat().st_size for f in got.values()) >> 20} MiB in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
