"""The local backend starts code without `site` (sandbox/boot.py): it must still behave like
`python main.py` run by the same interpreter on the host."""

from __future__ import annotations

import subprocess

import pytest

from sandbox.api import parse_run_request
from sandbox.backends.local import MOUNTED_ROOTS, PYTHON, LocalBackend
from sandbox.boot import site_dirs

CASES = {
    "semantics": "import sys\nprint(sys.argv, __name__, __file__.rsplit('/', 1)[1], __cached__, sorted(globals()),\n"
                 "      type(__loader__).__name__, __loader__.name, __spec__)",
    "inspect": "import inspect\ndef f():\n    return 1\nprint(inspect.getsource(f))",
    "traceback": "def f():\n    raise ValueError('x')\nf()",
    "chained": "try:\n    1 / 0\nexcept Exception as e:\n    raise KeyError(1) from e",
    "exit": "print('a', flush=True)\nexit(3)",
    "quit": "quit()",
    "sys_exit": "import sys\nsys.exit('bye')",
    "builtins": "print(repr(exit), repr(quit), repr(help))",
    "warning": "import warnings\nwarnings.warn('w')",
    "syntax_error": "x = (\nprint(1)\n",
}


@pytest.fixture(scope="module")
def backend():
    b = LocalBackend(pool_size=2)
    missing = b.probe().missing
    if missing:
        b.close()
        pytest.fail(f"local isolation incomplete on this host: {missing}")
    yield b
    b.close()


def _host_run(tmp_path, code: str) -> tuple[int, str, str]:
    """`python3 -E -s main.py` with `site`, on the host, as the reference."""
    (tmp_path / "main.py").write_text(code)
    out = subprocess.run([PYTHON, "-E", "-s", "main.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    return out.returncode, out.stdout, out.stderr.replace(str(tmp_path), "/work")


@pytest.mark.parametrize("name", sorted(CASES))
def test_runs_like_python_main_py(backend, tmp_path, name):
    code = CASES[name]
    r = backend.run(parse_run_request({"code": code}), 1 << 16)
    assert (r.return_code, r.stdout, r.stderr) == _host_run(tmp_path, code)


def test_site_packages_stay_importable(backend):
    """The host's site-packages dirs are on sys.path, after the stdlib, as `site` puts them."""
    want = site_dirs(PYTHON, MOUNTED_ROOTS)
    r = backend.run(parse_run_request({"code": "import sys, json\nprint(json.dumps(sys.path))"}), 1 << 16)
    import json

    path = json.loads(r.stdout)
    assert path[0] == "/work"
    assert path[len(path) - len(want):] == want
