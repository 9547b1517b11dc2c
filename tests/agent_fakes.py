"""Test-only fakes (kept out of the installed package): a small HTTP tool server and a scripted engine.

What they fake, exactly:
- `MiniToolServer` is a real HTTP server on 127.0.0.1 (random port) speaking the Search-R1
  `/retrieve` schema (also at `/search`, as retriever_server's web-search proxy does) and
  SandboxFusion's `/run_code`, but its search ranks an in-memory corpus by word overlap (no
  embedding model, no index), and `/run_code` runs the code in a plain `python -c` subprocess with
  a timeout and *no isolation* (no bubblewrap, cgroup or Docker). It can be told to fail or be slow
  per path, so tool-client and episode tests hit a real socket. The real retriever and sandbox have
  their own tests (tests/test_agent_services.py runs the agent against them; the `web` backend
  against the real `/search` proxy and a fake Serper is in tests/test_retriever_websearch.py).
- `ScriptedEngine` stands in for vLLM's `generate`: it replays fixed action texts through the real
  tokenizer, so episode logic is tested deterministically; `run_scripted_episodes` runs the real
  agent (OpenRLHF's AgentExecutor contract) over one such engine per script.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _score(query: str, contents: str) -> int:
    """Word-overlap score: enough ranking for tests, no model needed."""
    words = set(_words(query))
    return sum(1 for w in _words(contents) if w in words)


class MiniToolServer:
    """Context manager: `with MiniToolServer(corpus) as srv: srv.url("/retrieve")`."""

    def __init__(self, corpus: list[dict] | None = None):
        self.corpus = corpus or []
        self.requests: Counter = Counter()
        self.queries_seen = 0
        self.fail_status: dict[str, int] = {}
        self.delay_s: dict[str, float] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}{path}"

    def __enter__(self) -> MiniToolServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------ endpoints
    def retrieve(self, body: dict) -> dict:
        queries, topk = body["queries"], int(body.get("topk", 3))
        with self._lock:
            self.queries_seen += len(queries)
        result = []
        for q in queries:
            ranked = sorted(self.corpus, key=lambda d: -_score(q, d["contents"]))[:topk]
            if body.get("return_scores"):
                result.append([{"document": d, "score": float(_score(q, d["contents"]))} for d in ranked])
            else:
                result.append(ranked)
        return {"result": result}

    def run_code(self, body: dict) -> dict:
        timeout = float(body.get("run_timeout", 10))
        start = time.time()
        try:
            proc = subprocess.run([sys.executable, "-c", body["code"]], capture_output=True, text=True,
                                  timeout=timeout)
            run = {"status": "Finished", "return_code": proc.returncode, "stdout": proc.stdout,
                   "stderr": proc.stderr}
        except subprocess.TimeoutExpired as err:
            run = {"status": "TimeLimitExceeded", "return_code": None,
                   "stdout": (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or ""),
                   "stderr": ""}
        run["execution_time"] = time.time() - start
        ok = run["status"] == "Finished" and run["return_code"] == 0
        return {"status": "Success" if ok else "Failed", "message": "", "compile_result": None,
                "run_result": run, "executor_pod_name": None, "files": {}}

    def _handler(self):
        server = self
        routes = {"/retrieve": self.retrieve, "/run_code": self.run_code, "/search": self.retrieve}

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_POST(self):
                with server._lock:
                    server.requests[self.path] += 1
                time.sleep(server.delay_s.get(self.path, 0.0))
                status = server.fail_status.get(self.path)
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                    if status:
                        payload = {"error": f"forced failure {status}"}
                    elif self.path not in routes:
                        status, payload = 404, {"error": f"no route {self.path}"}
                    else:
                        status, payload = 200, routes[self.path](body)
                except (KeyError, ValueError, TypeError) as err:
                    status, payload = 400, {"error": f"bad request: {err}"}
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

        return Handler


class ScriptedEngine:
    """An engine with vLLM's `generate` contract that replays fixed action texts.

    Each call returns the next scripted text, tokenized with the real tokenizer, so episode
    logic can be tested deterministically; the real-model path is tested with HFGenerationEngine.
    """

    def __init__(self, tokenizer, script: list[str], output_cls, completion_cls):
        self.tokenizer, self.script = tokenizer, list(script)
        self.output_cls, self.completion_cls = output_cls, completion_cls
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        self.prompts.append(list(prompt_token_ids))
        text = self.script.pop(0) if self.script else ""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][: sampling_params.max_tokens]
        finish = "length" if len(ids) >= sampling_params.max_tokens else "stop"
        out = self.completion_cls(0, self.tokenizer.decode(ids), ids, finish)
        return self.output_cls(list(prompt_token_ids), [out])


def run_scripted_episodes(cfg, tok, scripts: list[list[str]], label: str, prompt: str = "task",
                          max_len: int = 4096) -> list[dict]:
    """The real agent's episodes, one per script, run concurrently as OpenRLHF runs a group;
    the tool clients of ``cfg`` are closed afterwards (their sessions belong to the loop)."""
    import asyncio

    from agent_env.openrlhf_agent import AgentExecutor
    from agent_env.tools import get_toolset
    from openrlhf_sgrpo.engine.sampling import CompletionOutput, RequestOutput, SamplingParams

    async def main():
        executor = AgentExecutor(cfg)
        try:
            return await asyncio.gather(*[
                executor.execute(prompt, label, SamplingParams(max_tokens=None), max_len, tok,
                                 ScriptedEngine(tok, s, RequestOutput, CompletionOutput)) for s in scripts])
        finally:
            await get_toolset(cfg).close()
    return asyncio.run(main())
