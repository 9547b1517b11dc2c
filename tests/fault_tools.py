"""Test-only fault injection around the real services (kept out of the installed package).

- :class:`RetrieverProcess`: ``python -m retriever_server.serve`` as a child process, so a test can
  SIGKILL it and start it again on the same port (the in-thread server cannot be killed alone).
- :class:`FaultProxy`: a loopback HTTP server in front of a real service. In ``pass`` mode it
  forwards each POST and returns the service's answer; in ``silent`` mode it takes the request and
  never writes a byte (a hang below HTTP: the client sees an open connection and nothing else);
  in ``garbage`` mode it answers 200 with a body that is not the agreed schema.
- :class:`ToolFaultHook`: arms one fault for a step and fires it, synchronously, right before the
  step's first call of a tool it targets, so every call of the step meets the fault (no race
  between the fault and the calls) while the step's rollouts are in flight.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from retriever_server.background import ServerProcess


class RetrieverProcess:
    """The real retriever as a child process (the project's ``ServerProcess``) that a test can
    SIGKILL and start again on the same port (0 picks one the first time)."""

    def __init__(self, index_dir: str, port: int = 0, start_timeout_s: float = 120.0):
        self.index_dir, self.port, self.start_timeout_s = str(index_dir), port, start_timeout_s
        self.server: ServerProcess | None = None
        self.url = ""

    def start(self) -> str:
        # ServerProcess passes --port 0 first; argparse keeps the last value, so a restart gets the old port
        self.server = ServerProcess("--index", self.index_dir, "--host", "127.0.0.1", "--port", str(self.port),
                                    "--log-level", "WARNING", startup_timeout_s=self.start_timeout_s).__enter__()
        self.url, self.port = self.server.url, self.server.port
        return self.url

    def _running(self) -> bool:
        return self.server is not None and self.server.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no drain, no goodbye; connections in flight are cut."""
        if self._running():
            self.server.proc.kill()
            self.server.proc.wait()

    def stop(self) -> None:
        if self._running():
            self.server.stop()  # SIGTERM (drain), SIGKILL if it hangs


class FaultProxy:
    """``with FaultProxy(upstream_base_url) as px: px.url + "/retrieve"``; set ``px.mode``."""

    MODES = ("pass", "silent", "garbage")

    def __init__(self, upstream: str, garbage: bytes = b'{"unexpected": "shape"}'):
        self.upstream, self.garbage = upstream.rstrip("/"), garbage
        self.mode = "pass"
        self.release = threading.Event()  # set: silent handlers give up (the test is over)
        self.requests = {m: 0 for m in self.MODES}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FaultProxy:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                mode = proxy.mode
                proxy.requests[mode] += 1
                if mode == "silent":
                    proxy.release.wait()  # never a byte back; the client's own timeout ends it
                    self.close_connection = True
                    return
                if mode == "garbage":
                    self._answer(200, proxy.garbage, "application/json")
                    return
                req = urllib.request.Request(proxy.upstream + self.path, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=60) as resp:
                        self._answer(resp.status, resp.read(), resp.headers.get("Content-Type", ""))
                except urllib.error.HTTPError as err:
                    self._answer(err.code, err.read(), "application/json")

            def _answer(self, code: int, data: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


class ToolFaultHook:
    """Wraps a ToolSet's tool clients; ``arm(tools, inject)`` fires ``inject()`` once, just before
    the next call of one of ``tools`` ("search", "code"), from inside the rollout."""

    METHODS = {"search": "search", "code": "run"}

    def __init__(self, tools):
        self.armed: tuple[str, Callable[[], None]] | None = None
        self.fired_at: float | None = None
        self.tools, self._original = tools, (tools.search, tools.sandbox)
        tools.search = _Hooked(tools.search, "search", self)
        tools.sandbox = _Hooked(tools.sandbox, "code", self)

    def remove(self) -> None:
        """Put the ToolSet's clients back (the ToolSet is process-wide, shared by later tests)."""
        self.tools.search, self.tools.sandbox = self._original

    def arm(self, tools: tuple[str, ...], inject: Callable[[], None]) -> None:
        """Fire ``inject()`` once, before the next call of any of ``tools``."""
        unknown = set(tools) - set(self.METHODS)
        if unknown or not tools:
            raise ValueError(f"tools must be some of {sorted(self.METHODS)}, got {tools!r}")
        self.armed, self.fired_at = (tuple(tools), inject), None

    def before_call(self, tool: str) -> None:
        if self.armed is not None and tool in self.armed[0]:
            _, inject = self.armed
            self.armed = None
            inject()
            self.fired_at = time.monotonic()


class _Hooked:
    def __init__(self, client, tool: str, hook: ToolFaultHook):
        self._client, self._tool, self._hook = client, tool, hook

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if name != ToolFaultHook.METHODS[self._tool]:
            return attr

        async def call(*args, **kwargs):
            self._hook.before_call(self._tool)
            return await attr(*args, **kwargs)
        return call


def freeze(pid: int) -> None:
    """SIGSTOP: the process keeps its listening socket, so the kernel still accepts connections,
    but nothing reads them: a run that never returns."""
    os.kill(pid, signal.SIGSTOP)


def thaw(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


# ---- the single-machine runner killed mid-step (tests/test_faults_local.py) ---------------------
RESUME_QUESTIONS = [("q0", "What is the capital of France?", ["Paris"]),
                    ("q1", "What is the capital of Germany?", ["Berlin"]),
                    ("q2", "What is Earth's highest mountain?", ["Mount Everest"]),
                    ("q3", "Where did jazz originate?", ["New Orleans"])]
KILL_MARKER = "killed-here"


def build_resume_trainer(out: str, retriever_url: str, sandbox_url: str, steps: int, trainer_cls=None):
    """The same small run in the child that is killed and in the test that resumes it: tiny
    Qwen2, real tools, ``spread_script`` first turns, a checkpoint and 2 record groups per step."""
    from agent_env.config import AgentConfig
    from openrlhf_sgrpo import assets
    from openrlhf_sgrpo.engine.hf import HFGenerationEngine
    from openrlhf_sgrpo.local.data import Question
    from openrlhf_sgrpo.local.rollout import AgentRollout
    from openrlhf_sgrpo.local.scripted import spread_script
    from openrlhf_sgrpo.local.trainer import LocalTrainer, TrainConfig
    from openrlhf_sgrpo.testing import shifted_seed

    model, tok = assets.tiny_qwen2(seed=shifted_seed(0))
    cfg = AgentConfig(retriever_url=retriever_url, sandbox_url=sandbox_url, template="none", max_turns=1,
                      max_obs_tokens=32, reward="f1", format_reward=True)
    rollout = AgentRollout(HFGenerationEngine(model, tok, seed=shifted_seed(1)), tok, cfg, max_len=128,
                           max_tokens_per_turn=8, first_turn_script=spread_script)
    tcfg = TrainConfig(steps=steps, prompts_per_step=2, n_samples=4, micro_batch_size=4, lr=1e-3, save_every=1,
                       record_groups=2, seed=shifted_seed(0))
    questions = [Question(*q) for q in RESUME_QUESTIONS]
    return (trainer_cls or LocalTrainer)(model, tok, rollout, questions, tcfg, out), rollout


def _resume_child(out: str, retriever_url: str, sandbox_url: str, kill_step: str) -> None:
    """Train until step ``kill_step`` has logged its metrics line and records, then stop inside
    its checkpoint save (the window where they are ahead of the checkpoint) and wait there for the
    test's SIGKILL, after saying so in a marker file."""
    from pathlib import Path

    from openrlhf_sgrpo.local.trainer import LocalTrainer

    class StopsInSave(LocalTrainer):
        def save(self):
            if self.step == int(kill_step):
                (Path(out) / KILL_MARKER).write_text(str(self.step))
                signal.pause()  # the test SIGKILLs this process here
            return super().save()

    trainer, _ = build_resume_trainer(out, retriever_url, sandbox_url, int(kill_step) + 1, StopsInSave)
    trainer.train(progress=False)


if __name__ == "__main__":
    if sys.argv[1:2] == ["resume-child"]:
        _resume_child(*sys.argv[2:6])
