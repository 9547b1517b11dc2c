"""`print(1)` executions per second through the HTTP service, 1/4/16 concurrent clients.

Backends: local (bwrap+cgroup), with its static launcher and with the shell launcher as the
same-run baseline; the Docker warm pool in both modes, resident (the container's
pid-1 runner spawns each run) and exec (one `docker exec` per run); Docker cold (one container per
run). Prints a table and the ratios warm/cold, static/shell launcher and local-vs-goal, all measured in this same run.

    python bench/sandbox_throughput.py --runs 64 [--skip-docker]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from tqdm import tqdm

from agent_env.tools.http import HttpPolicy, JsonHttp
from agent_env.tools.sandbox import SandboxClient

from sandbox.testing import RunningSandbox

BODY = {"code": "print(1)", "language": "python"}
LOCAL_GOAL_16 = 60.0


def measure(url: str, clients: int, runs: int) -> float:
    """Executions/s for `runs` requests with `clients` in flight, sent the way rollouts send them:
    through the agent's own pooled async tool client (agent_env.tools.SandboxClient)."""

    async def go() -> float:
        http = JsonHttp(HttpPolicy(max_connections=clients))
        client = SandboxClient(f"{url}/run_code", http)
        gate = asyncio.Semaphore(clients)

        async def one(bar: tqdm | None = None) -> bool:
            async with gate:
                out = await client.run(BODY["code"])
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


def bench(name: str, backend: str, extra: list[str], clients: list[int], runs: int, conc: int) -> dict[int, float]:
    out = {}
    with RunningSandbox(backend=backend, max_concurrency=conc, max_queue=256, extra_args=extra) as sb:
        for c in clients:
            out[c] = measure(sb.url, c, runs)
            print(f"{name:>12} | {c:>2} clients | {out[c]:7.1f} exec/s", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=64, help="timed requests per client count")
    p.add_argument("--cold-runs", type=int, default=16)
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument("--skip-docker", action="store_true")
    a = p.parse_args()
    clients = [int(c) for c in a.clients.split(",")]
    results = {"local": bench("local", "local", [], clients, a.runs, a.max_concurrency),
               "local_shell": bench("local shell", "local", ["--local-launcher", "shell"], clients, a.runs,
                                    a.max_concurrency)}
    if not a.skip_docker:
        for mode in ("resident", "warm"):
            results[f"docker_{mode}"] = bench(f"docker {mode}", "docker", ["--docker-mode", mode], clients,
                                              a.runs, a.max_concurrency)
        results["docker_cold"] = bench("docker cold", "docker", ["--docker-mode", "cold"], clients,
                                       a.cold_runs, a.max_concurrency)
    print("\nratios (same run):")
    top = max(clients)
    print(f"  local @{top} clients vs goal {LOCAL_GOAL_16}/s: {results['local'][top] / LOCAL_GOAL_16:.2f}x")
    for c in clients:
        print(f"  local static launcher / shell launcher @{c:>2} clients: "
              f"{results['local'][c] / results['local_shell'][c]:.2f}x")
    if "docker_cold" in results:
        for mode in ("resident", "warm"):
            for c in clients:
                print(f"  docker {mode} / cold @{c:>2} clients: "
                      f"{results[f'docker_{mode}'][c] / results['docker_cold'][c]:.1f}x (goal >= 5x)")
        for c in clients:
            print(f"  local / docker resident @{c:>2} clients: "
                  f"{results['local'][c] / results['docker_resident'][c]:.1f}x")
    print(json.dumps({k: {str(c): round(v, 2) for c, v in r.items()} for k, r in results.items()}))


if __name__ == "__main__":
    main()
