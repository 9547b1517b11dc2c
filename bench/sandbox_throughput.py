"""`print(1)` executions per second, 1/4/16 concurrent clients, with same-run baselines.

Our service, through HTTP the way rollouts call it (the agent's pooled async tool client,
agent_env.tools.SandboxClient): the local backend (bwrap + cgroup) and, unless --skip-docker,
the Docker resident pool (the container's pid-1 runner spawns each run) and Docker cold (one
container per run).
Baselines, measured in this same run in-process (no HTTP, which favours them):
- verl-tool style: a fresh `firejail ... python3 main.py` per execution with its flags and
  rlimits (verl_tool/servers/tools/python_code.py); skipped, with the reason, without firejail;
- bare: `python3 main.py` per execution with no isolation at all, the floor any sandbox pays.
Prints a table and the ratios, all from this run.

    python bench/sandbox_throughput.py --runs 64 [--skip-docker]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

from agent_env.tools.http import HttpPolicy, JsonHttp
from agent_env.tools.sandbox import SandboxClient
from sandbox.process import SandboxProcess

CODE = "print(1)"
PYTHON = "/usr/bin/python3"  # the interpreter the local backend runs
FIREJAIL = ["firejail", "--quiet", "--seccomp=socket", "--noprofile", "--rlimit-nproc=32", "--rlimit-nofile=32",
            "--rlimit-fsize=2m", "--rlimit-as=1096m"]


def measure_http(url: str, clients: int, runs: int) -> float:
    """Executions/s for `runs` requests with `clients` in flight, through the agent's tool client."""

    async def go() -> float:
        http = JsonHttp(HttpPolicy(max_connections=clients))
        client = SandboxClient(f"{url}/run_code", http)
        gate = asyncio.Semaphore(clients)

        async def one(bar: tqdm | None = None) -> bool:
            async with gate:
                out = await client.run(CODE)
            if bar is not None:
                bar.update(1)
            return out == "1\n"

        try:
            await asyncio.gather(*(one() for _ in range(clients)))  # warm-up: open every connection
            with tqdm(total=runs, desc=f"{clients} clients", leave=False) as bar:
                start = time.perf_counter()
                ok = await asyncio.gather(*(one(bar) for _ in range(runs)))
                elapsed = time.perf_counter() - start
        finally:
            await http.close()
        if not all(ok):
            raise RuntimeError(f"{ok.count(False)} of {runs} runs did not print 1")
        return runs / elapsed

    return asyncio.run(go())


def _verl_tool_limits() -> None:
    """verl-tool's preexec rlimits (address space, CPU seconds, file size)."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.RLIM_INFINITY))
    resource.setrlimit(resource.RLIMIT_CPU, (10, resource.RLIM_INFINITY))
    resource.setrlimit(resource.RLIMIT_FSIZE, (500 << 20, 500 << 20))


def per_exec(prefix: list[str]) -> Callable[[], bool]:
    """One execution as a fresh process in a fresh temp dir, the way per-exec executors run code."""
    def one() -> bool:
        with tempfile.TemporaryDirectory() as work:
            script = os.path.join(work, "main.py")
            with open(script, "w") as fh:
                fh.write(CODE)
            out = subprocess.run([*prefix, PYTHON, script], cwd=work, capture_output=True, timeout=60,
                                 preexec_fn=_verl_tool_limits if prefix else None)
        return out.stdout == b"1\n"
    return one


def measure_per_exec(one: Callable[[], bool], clients: int, runs: int) -> float:
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda _: one(), range(clients)))  # warm-up
        start = time.perf_counter()
        ok = list(tqdm(pool.map(lambda _: one(), range(runs)), total=runs, desc=f"{clients} clients", leave=False))
        elapsed = time.perf_counter() - start
    if not all(ok):
        raise RuntimeError(f"{ok.count(False)} of {runs} executions did not print 1")
    return runs / elapsed


def row(name: str, rates: dict[int, float]) -> dict[int, float]:
    for c, rate in rates.items():
        print(f"{name:>16} | {c:>2} clients | {rate:7.1f} exec/s", flush=True)
    return rates


def bench_service(name: str, backend: str, extra: list[str], clients: list[int], runs: int, conc: int) -> dict[int, float]:
    with SandboxProcess(backend=backend, max_concurrency=conc, max_queue=256, extra_args=extra) as sb:
        return row(name, {c: measure_http(sb.url, c, runs) for c in clients})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=64, help="timed executions per client count")
    p.add_argument("--cold-runs", type=int, default=16)
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument("--skip-docker", action="store_true")
    a = p.parse_args()
    clients = [int(c) for c in a.clients.split(",")]
    results = {"local": bench_service("local", "local", [], clients, a.runs, a.max_concurrency)}
    if shutil.which("firejail"):
        results["firejail"] = row("verl-tool firejail", {c: measure_per_exec(per_exec(FIREJAIL), c, a.runs)
                                                          for c in clients})
    else:
        print("verl-tool firejail baseline skipped: firejail is not installed (apt-get install firejail)")
    results["bare"] = row("bare python3", {c: measure_per_exec(per_exec([]), c, a.runs) for c in clients})
    if not a.skip_docker:
        results["docker_resident"] = bench_service("docker resident", "docker", ["--docker-mode", "resident"],
                                                   clients, a.runs, a.max_concurrency)
        results["docker_cold"] = bench_service("docker cold", "docker", ["--docker-mode", "cold"], clients,
                                               a.cold_runs, a.max_concurrency)
    print("\nratios (same run):")
    for c in clients:
        if "firejail" in results:
            print(f"  local / verl-tool firejail per exec @{c:>2} clients: "
                  f"{results['local'][c] / results['firejail'][c]:.2f}x")
        print(f"  local / bare python3 per exec (no isolation) @{c:>2} clients: "
              f"{results['local'][c] / results['bare'][c]:.2f}x")
    if "docker_cold" in results:
        for c in clients:
            print(f"  docker resident / cold @{c:>2} clients: "
                  f"{results['docker_resident'][c] / results['docker_cold'][c]:.1f}x (goal >= 5x)")
        for c in clients:
            print(f"  local / docker resident @{c:>2} clients: {results['local'][c] / results['docker_resident'][c]:.1f}x")
    print(json.dumps({k: {str(c): round(v, 2) for c, v in r.items()} for k, r in results.items()}))


if __name__ == "__main__":
    main()
