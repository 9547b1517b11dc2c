"""`print(1)` executions per second, 1/4/16 concurrent clients, with same-run baselines.

Our service, through HTTP the way rollouts call it (the agent's pooled async tool client,
agent_env.tools.SandboxClient): the local warm pool (bwrap + cgroup sandboxes whose pid-1 runner
spawns each run), local cold (a fresh bwrap sandbox per run) and, unless --skip-docker, the Docker
resident pool (the same runner in each container) and Docker cold (one container per run).
Baselines, measured in this same run in-process (no HTTP, which favours them):
- verl-tool style: a fresh `firejail ... python3 main.py` per execution with its flags and
  rlimits (verl_tool/servers/tools/python_code.py); skipped, with the reason, without firejail;
- bare: `python3 main.py` per execution with no isolation at all, the floor any sandbox pays.

Interleaved: every service is started first; then, for each client count, `--rounds` rounds each
run every contender for its share of the executions in turn, and a rate is all its executions over
all its time. On a machine shared with other work, load that comes and goes then weighs on every
contender alike, instead of on whichever happened to be measured at the time.
Prints a table and the ratios, all from this run.

    python bench/sandbox_throughput.py --runs 64 [--rounds 4] [--skip-docker]
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
from contextlib import ExitStack

from agent_env.tools.http import HttpPolicy, JsonHttp
from agent_env.tools.sandbox import SandboxClient
from sandbox.process import SandboxProcess

CODE = "print(1)"
PYTHON = "/usr/bin/python3"  # the interpreter the local backend runs
FIREJAIL = ["firejail", "--quiet", "--seccomp=socket", "--noprofile", "--rlimit-nproc=32", "--rlimit-nofile=32",
            "--rlimit-fsize=2m", "--rlimit-as=1096m"]
Measure = Callable[[int, int], float]  # (clients, executions) -> seconds taken


def http_contender(url: str) -> Measure:
    """Executions through the agent's tool client, `clients` in flight (connections opened first)."""

    def measure(clients: int, runs: int) -> float:
        async def go() -> float:
            http = JsonHttp(HttpPolicy(max_connections=clients))
            client = SandboxClient(f"{url}/run_code", http)
            gate = asyncio.Semaphore(clients)

            async def one() -> bool:
                async with gate:
                    return await client.run(CODE) == "1\n"

            try:
                await asyncio.gather(*(one() for _ in range(clients)))  # warm-up: open every connection
                start = time.perf_counter()
                ok = await asyncio.gather(*(one() for _ in range(runs)))
                elapsed = time.perf_counter() - start
            finally:
                await http.close()
            if not all(ok):
                raise RuntimeError(f"{ok.count(False)} of {runs} runs did not print 1")
            return elapsed

        return asyncio.run(go())

    return measure


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


def per_exec_contender(prefix: list[str]) -> Measure:
    one = per_exec(prefix)

    def measure(clients: int, runs: int) -> float:
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(lambda _: one(), range(clients)))  # warm-up
            start = time.perf_counter()
            ok = list(pool.map(lambda _: one(), range(runs)))
            elapsed = time.perf_counter() - start
        if not all(ok):
            raise RuntimeError(f"{ok.count(False)} of {runs} executions did not print 1")
        return elapsed

    return measure


def interleaved(contenders: dict[str, tuple[Measure, int]], clients: list[int], rounds: int) -> dict[str, dict[int, float]]:
    """exec/s per contender and client count; each round gives every contender runs/rounds executions."""
    rates: dict[str, dict[int, float]] = {name: {} for name in contenders}
    for c in clients:
        spent = {name: 0.0 for name in contenders}
        done = {name: 0 for name in contenders}
        for r in range(rounds):
            for name, (measure, runs) in contenders.items():
                share = max(runs // rounds, c)  # at least one execution per client in flight
                spent[name] += measure(c, share)
                done[name] += share
            print(f"  {c} clients: round {r + 1}/{rounds}", flush=True)
        for name in contenders:
            rates[name][c] = done[name] / spent[name]
            print(f"{name:>18} | {c:>2} clients | {rates[name][c]:7.1f} exec/s", flush=True)
    return rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=64, help="timed executions per client count and contender")
    p.add_argument("--cold-runs", type=int, default=16, help="timed executions per client count, cold modes")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds the executions are split into")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument("--skip-docker", action="store_true")
    a = p.parse_args()
    clients = [int(c) for c in a.clients.split(",")]
    services = {"local": ("local", [], a.runs), "local_cold": ("local", ["--mode", "cold"], a.cold_runs)}
    if not a.skip_docker:
        services["docker_resident"] = ("docker", ["--mode", "resident"], a.runs)
        services["docker_cold"] = ("docker", ["--mode", "cold"], a.cold_runs)
    with ExitStack() as stack:
        contenders: dict[str, tuple[Measure, int]] = {}
        for name, (backend, extra, runs) in services.items():
            sb = stack.enter_context(SandboxProcess(backend=backend, max_concurrency=a.max_concurrency,
                                                    max_queue=256, extra_args=extra))
            contenders[name] = (http_contender(sb.url), runs)
        if shutil.which("firejail"):
            contenders["firejail"] = (per_exec_contender(FIREJAIL), a.runs)
        else:
            print("verl-tool firejail baseline skipped: firejail is not installed (apt-get install firejail)")
        contenders["bare"] = (per_exec_contender([]), a.runs)
        results = interleaved(contenders, clients, a.rounds)
    print(f"\nratios (same run, {a.rounds} interleaved rounds, load average {os.getloadavg()[0]:.1f}):")
    for c in clients:
        if "firejail" in results:
            print(f"  local / verl-tool firejail per exec @{c:>2} clients: "
                  f"{results['local'][c] / results['firejail'][c]:.2f}x (goal >= 2x at 4 and 16, >= 1x at 1)")
        print(f"  local / bare python3 per exec (no isolation) @{c:>2} clients: "
              f"{results['local'][c] / results['bare'][c]:.2f}x")
        print(f"  local warm / local cold (a fresh sandbox per run) @{c:>2} clients: "
              f"{results['local'][c] / results['local_cold'][c]:.1f}x")
    if "docker_cold" in results:
        for c in clients:
            print(f"  docker resident / cold @{c:>2} clients: "
                  f"{results['docker_resident'][c] / results['docker_cold'][c]:.1f}x (goal >= 5x)")
        for c in clients:
            print(f"  local / docker resident @{c:>2} clients: {results['local'][c] / results['docker_resident'][c]:.2f}x")
    print(json.dumps({k: {str(c): round(v, 2) for c, v in r.items()} for k, r in results.items()}))


if __name__ == "__main__":
    main()
