"""A training run survives its tools' faults: the single-machine runner (OpenRLHF's agent executor,
our agent, the HF engine on the tiny Qwen2, LocalTrainer) with the real retriever (MiniLM + FAISS,
a child process) and the real sandbox (local backend) on loopback.

Each faulted step injects one fault while its rollouts are in flight, right before the step's first
call of the tool it hits (``tests/fault_tools.py``), so every call of that tool in the step meets
it; the fault is lifted after the step and the next step must run normally. Faults:
  1. the retriever SIGKILLed, started again on the same port after the step;
  2. the sandbox SIGKILLed and restarted on the same port; the sandbox frozen (SIGSTOP), so a run
     never returns, thawed after the step;
  3. a proxy in front of the retriever that takes the request and never sends a byte;
  4. 200 answers whose bodies are not the agreed schema (retriever: JSON of another shape;
     sandbox: an HTML page).
For each faulted step the test checks: every call of the hit tool failed, was shown to the policy
as a failure observation and counted (``tool_errors`` and the tool's ``*_errors``), the other
tool's calls went through; each call ended within the bound the HTTP policy gives for that fault
(``HttpPolicy``: backoffs for a dead service, one timeout for a hang, no wait for garbage) and the
rollout within its generation time plus ``max_turns`` such bounds; the strata count a failed
call as a call; every prompt group keeps ``n_samples`` samples in slot order (scripted first turns
name their slot); the step's metrics line and rollout records show the burst.

The bounds add SLACK_S for scheduling on a shared 2-core machine; no fixed sleep decides a result.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import fault_tools
import pytest
from fault_tools import KILL_MARKER, FaultProxy, RetrieverProcess, ToolFaultHook, build_resume_trainer, freeze, thaw

from agent_env import info_keys as K
from agent_env.config import AgentConfig
from agent_env.tools.http import HttpPolicy
from agent_env.tools.sandbox import HTTP_MARGIN_S
from openrlhf_sgrpo import assets
from openrlhf_sgrpo.engine.hf import HFGenerationEngine
from openrlhf_sgrpo.local.data import Question
from openrlhf_sgrpo.local.rollout import AgentRollout
from openrlhf_sgrpo.local.step_log import read_step_log
from openrlhf_sgrpo.local.trainer import LocalTrainer, TrainConfig
from openrlhf_sgrpo.rollout_records.store import read_jsonl, step_path
from openrlhf_sgrpo.testing import shifted_seed

pytestmark = pytest.mark.slow

SLACK_S = 2.0  # event-loop and thread scheduling on a loaded 2-core box, on top of each derived bound
PASSAGES = [
    ("Paris", "Paris is the capital and most populous city of France."),
    ("Berlin", "Berlin is the capital and largest city of Germany."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level."),
    ("Jazz", "Jazz is a music genre that originated in New Orleans."),
]
QUESTIONS = [Question("q0", "What is the capital of France?", ["Paris"]),
             Question("q1", "What is the capital of Germany?", ["Berlin"]),
             Question("q2", "What is Earth's highest mountain?", ["Mount Everest"]),
             Question("q3", "Where did jazz originate?", ["New Orleans"])]
PROMPTS, N = 2, 4


def fault_script(slot: int, question: str, golds: list[str]) -> str | None:
    """Slots 0 and 2 search, slot 1 runs code, slot 3 is sampled; each scripted turn names its slot."""
    if slot in (0, 2):
        return f"<think>slot {slot}</think>\n<search> {question} </search>"
    if slot == 1:
        return "<think>slot 1</think>\n<code>print(6 * 7)</code>"
    return None


SCRIPTED = {0: "search", 1: "code", 2: "search"}
ERRORS = {"search": K.SEARCH_ERRORS, "code": K.CODE_ERRORS}
CALLS = {"search": K.SEARCH_CALLS, "code": K.CODE_CALLS}
FAILED = {"search": "search failed:", "code": "code execution failed:"}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    from retriever_server.build_index import build_index

    d = tmp_path_factory.mktemp("fault_corpus")
    with open(d / "corpus.jsonl", "w") as f:
        f.writelines(json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n" for i, (t, x) in enumerate(PASSAGES))
    build_index(d / "corpus.jsonl", d / "index", model=str(assets.minilm_dir()), progress=False)
    return d / "index"


@pytest.fixture(scope="module")
def retriever(index_dir):
    proc = RetrieverProcess(index_dir)
    proc.start()
    yield proc
    proc.stop()


class Sandbox:
    """The real sandbox service; ``kill()`` is SIGKILL, ``restart()`` starts it on the same port."""

    def __init__(self):
        from sandbox.process import SandboxProcess

        self._cls, self.port, self.proc = SandboxProcess, 0, None

    def start(self) -> str:
        from sandbox.process import SandboxStartError

        self.proc = self._cls(backend="local", max_concurrency=4, extra_args=["--port", str(self.port)])
        try:
            url = self.proc.start()
        except SandboxStartError as err:
            if not err.environment_missing:
                raise
            pytest.skip(f"this host lacks what the local sandbox needs: {err}")
        self.port = int(url.rsplit(":", 1)[1])
        return url

    def kill(self) -> None:
        self.proc.proc.kill()
        self.proc.proc.wait()
        self.proc.stop()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


@pytest.fixture(scope="module")
def sandbox():
    sb = Sandbox()
    sb.start()
    yield sb
    sb.stop()


@dataclass
class Fault:
    """One fault: which tools it hits, how to cause and lift it, and the bound on one hit call."""

    tools: tuple[str, ...]
    inject: object
    heal: object
    call_bound_s: float
    min_call_s: float = 0.0
    name: str = ""


@dataclass
class Outcome:
    step: int
    fault: Fault | None
    infos: list[dict]
    strata: list[int]
    timing: dict
    calls: dict[str, list[float]] = field(default_factory=dict)


def _agent_config(search_url: str, code_url: str) -> AgentConfig:
    return AgentConfig(retriever_url=search_url, sandbox_url=code_url, template="deep_research", max_turns=2,
                       topk=2, max_obs_tokens=48, reward="f1", request_timeout_s=2.0, code_timeout_s=1.0,
                       retries=2, backoff_s=0.1, batch_window_ms=5.0)


def _policy(cfg: AgentConfig) -> HttpPolicy:
    return HttpPolicy(timeout_s=cfg.request_timeout_s, retries=cfg.retries, backoff_s=cfg.backoff_s)


class HealAfterRollout:
    """The trainer's rollout, lifting the armed fault as soon as the step's rollout is over (the
    update then overlaps a slow restart, which is joined before the next rollout starts)."""

    def __init__(self, rollout: AgentRollout):
        self.rollout, self.heal, self._pending = rollout, None, None

    def run(self, *args, **kwargs):
        if self._pending is not None:
            self._pending.join()
            self._pending = None
        try:
            return self.rollout.run(*args, **kwargs)
        finally:
            if self.heal is not None:
                self._pending = threading.Thread(target=self.heal)
                self._pending.start()
                self.heal = None

    def join(self) -> None:
        if self._pending is not None:
            self._pending.join()

    def __getattr__(self, name):
        return getattr(self.rollout, name)


def run_with_faults(cfg: AgentConfig, faults: dict[int, Fault], steps: int, out) -> list[Outcome]:
    model, tok = assets.tiny_qwen2(seed=shifted_seed(0))
    rollout = AgentRollout(HFGenerationEngine(model, tok, seed=shifted_seed(1)), tok, cfg, max_len=320,
                           max_tokens_per_turn=12, first_turn_script=fault_script)
    hook = ToolFaultHook(rollout.tools)
    healing = HealAfterRollout(rollout)
    tcfg = TrainConfig(steps=steps, prompts_per_step=PROMPTS, n_samples=N, micro_batch_size=4, lr=1e-3,
                       record_groups=PROMPTS, seed=shifted_seed(0))
    trainer = LocalTrainer(model, tok, healing, QUESTIONS, tcfg, out)
    outcomes = []
    try:
        for step in range(1, steps + 1):
            fault = faults.get(step)
            if fault is not None:
                hook.arm(fault.tools, fault.inject)
                healing.heal = fault.heal
            res = trainer.train_step()
            assert res.step == step
            assert fault is None or hook.fired_at is not None, f"the fault of step {step} never fired"
            calls = {t: [b - a for a, b in rollout.recorder.get(t)] for t in ("search", "code")}
            outcomes.append(Outcome(step, fault, [dict(s.info) for s in res.experience.samples],
                                    res.experience.advantage.strata.tolist(), dict(res.record), calls))
    finally:
        healing.join()
        hook.remove()
        rollout.close()
    return outcomes


def check_run(outcomes: list[Outcome], cfg: AgentConfig, out) -> None:
    rows = {r["step"]: r for r in read_step_log(out / "metrics.jsonl", "train")}
    assert sorted(rows) == [o.step for o in outcomes]
    for o in outcomes:
        _check_groups(o, out)
        hit = o.fault.tools if o.fault else ()
        for i, info in enumerate(o.infos):
            assert info[K.TOOL_ERRORS] == info[K.SEARCH_ERRORS] + info[K.CODE_ERRORS]
            for tool in ("search", "code"):
                expected = info[CALLS[tool]] if tool in hit else 0  # every hit call failed, no other did
                assert info[ERRORS[tool]] == expected, (o.step, o.fault and o.fault.name, i, info)
        for tool in ("search", "code"):
            total = sum(info[ERRORS[tool]] for info in o.infos)
            assert rows[o.step][f"{tool}_errors_total"] == total
            if tool in hit:  # the scripted calls at least: the burst is in the step's metrics line
                assert total >= PROMPTS * list(SCRIPTED.values()).count(tool)
        assert rows[o.step]["tool_errors_total"] == sum(info[K.TOOL_ERRORS] for info in o.infos)
        _check_strata(o)
        if o.fault is not None:
            _check_bounds(o, cfg)


def _check_groups(o: Outcome, out) -> None:
    """No sample dropped or duplicated: every group holds N samples in slot order; the scripted
    turn of slot k names slot k; a hit tool's call shows its failure, a working tool its answer."""
    groups = read_jsonl(step_path(out, "train", o.step)).groups
    assert [g["group"] for g in groups] == list(range(PROMPTS)) and len(o.infos) == PROMPTS * N
    hit = o.fault.tools if o.fault else ()
    for g in groups:
        assert g["n"] == N and [s["sample"] for s in g["samples"]] == list(range(N))
        for slot, tool in SCRIPTED.items():
            turn = g["samples"][slot]["turns"][0]
            assert f"slot {slot}" in turn["text"] and turn["kind"] == tool, turn
            if tool in hit:
                assert turn["output"].lstrip().startswith(("<information>" if tool == "search" else "<result>")
                                                          + FAILED[tool]), turn["output"]
                assert g["samples"][slot][K.TOOL_ERRORS] >= 1
            else:
                assert FAILED[tool] not in turn["output"]
                assert ("Doc 1(Title:" if tool == "search" else "42") in turn["output"], turn["output"]


def _check_strata(o: Outcome) -> None:
    """A failed call is a call: within a group, two samples share a stratum exactly when they made
    the same number of tool calls, failed ones included (the default stratify_by=tool_calls)."""
    for g in range(PROMPTS):
        rows = range(g * N, (g + 1) * N)
        for i in rows:
            for j in rows:
                same_calls = o.infos[i][K.TOOL_CALLS] == o.infos[j][K.TOOL_CALLS]
                assert (o.strata[i] == o.strata[j]) == same_calls, (o.step, o.strata, o.infos)


def _check_bounds(o: Outcome, cfg: AgentConfig) -> None:
    for tool in o.fault.tools:
        durations = o.calls[tool]
        assert durations, f"no {tool} call in step {o.step}"
        assert max(durations) <= o.fault.call_bound_s, (o.fault.name, tool, durations, o.fault.call_bound_s)
        assert min(durations) >= o.fault.min_call_s, (o.fault.name, tool, durations)
    wall, busy = o.timing["time/rollout_wall_s"], o.timing["time/generate_busy_s"]
    assert wall <= busy + cfg.max_turns * o.fault.call_bound_s, (o.fault.name, o.timing)


def test_run_survives_killed_and_frozen_services(retriever, sandbox, tmp_path):
    cfg = _agent_config(retriever.url + "/retrieve", f"http://127.0.0.1:{sandbox.port}/run_code")
    policy, window = _policy(cfg), cfg.batch_window_ms / 1000
    refused = policy.backoff_total_s() + window + SLACK_S  # a dead port refuses at once: backoffs only
    frozen = cfg.code_timeout_s + HTTP_MARGIN_S  # the client's one timeout; time-outs are not retried
    assert refused < policy.worst_case_s() and frozen + SLACK_S < policy.worst_case_s(frozen)
    pid = {}

    def freeze_sandbox():
        pid["sb"] = sandbox.proc.proc.pid
        freeze(pid["sb"])

    # each fault is followed by a step in which the tool it hit must work again
    faults = {
        1: Fault(("code",), sandbox.kill, sandbox.start, refused, name="sandbox SIGKILL"),
        2: Fault(("search",), retriever.kill, retriever.start, refused, name="retriever SIGKILL"),
        3: Fault(("code",), freeze_sandbox, lambda: thaw(pid["sb"]), frozen + SLACK_S, min_call_s=frozen - 0.1,
                 name="sandbox run never returns (SIGSTOP)"),
    }
    outcomes = run_with_faults(cfg, faults, 4, tmp_path)
    check_run(outcomes, cfg, tmp_path)


def test_run_survives_a_silent_tool_and_garbage_answers(retriever, sandbox, tmp_path):
    with FaultProxy(retriever.url) as search_px, \
            FaultProxy(f"http://127.0.0.1:{sandbox.port}", garbage=b"<html>upstream trouble</html>") as code_px:
        cfg = _agent_config(search_px.url + "/retrieve", code_px.url + "/run_code")
        window = cfg.batch_window_ms / 1000

        def set_modes(mode: str, proxies):
            def apply():
                for px in proxies:
                    px.mode = mode
            return apply

        both = (search_px, code_px)
        faults = {
            1: Fault(("search",), set_modes("silent", [search_px]), set_modes("pass", both),
                     cfg.request_timeout_s + window + SLACK_S, min_call_s=cfg.request_timeout_s - 0.1,
                     name="accepts, sends nothing"),
            2: Fault(("search", "code"), set_modes("garbage", both), set_modes("pass", both), window + SLACK_S,
                     name="200 outside the schema"),
        }
        outcomes = run_with_faults(cfg, faults, 3, tmp_path)
        # a time-out is not retried and a 200 is an answer: at most one request per call (searches
        # share batched requests), exactly one per code call
        assert 1 <= search_px.requests["silent"] <= len(outcomes[0].calls["search"])
        assert code_px.requests["garbage"] == len(outcomes[1].calls["code"])
    check_run(outcomes, cfg, tmp_path)


def test_runner_killed_mid_step_resumes_without_losing_or_doubling_a_step(retriever, sandbox, tmp_path):
    """The runner (a child process) is SIGKILLed inside step 2's checkpoint save: step 2's metrics
    line and records are written, its checkpoint is not (the last one is step 1's). The resumed run
    must continue from step 1 with the same numbering, redo step 2 once and go on to step 3; a
    metrics line cut short (appended here: what a kill mid-write leaves) must not survive."""
    out = tmp_path / "run"
    out.mkdir()
    sandbox_url = f"http://127.0.0.1:{sandbox.port}/run_code"
    child = subprocess.Popen([sys.executable, fault_tools.__file__, "resume-child", str(out),
                              retriever.url + "/retrieve", sandbox_url, "2"])
    try:
        deadline = time.monotonic() + 300  # liveness only: two tiny steps plus the child's imports
        while not (out / KILL_MARKER).exists():
            assert child.poll() is None, f"the child exited with {child.returncode} before step 2's save"
            assert time.monotonic() < deadline, "the child never reached step 2's save"
            time.sleep(0.2)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    killed_at = time.time()
    metrics = out / "metrics.jsonl"
    before = metrics.read_bytes().splitlines(keepends=True)
    assert [json.loads(line)["step"] for line in before] == [1, 2]
    assert _record_steps(out) == [1, 2] and _checkpoints(out) == ["step_1"]  # ahead of the checkpoint
    with open(metrics, "ab") as f:
        f.write(b'{"phase": "train", "step": 3, "rew')  # a line a kill mid-write leaves

    trainer, rollout = build_resume_trainer(str(out), retriever.url + "/retrieve", sandbox_url, 3)
    try:
        assert trainer.resume() and trainer.step == 1
        assert metrics.read_bytes().splitlines(keepends=True) == before[:1] and _record_steps(out) == [1]
        records = trainer.train(progress=False)
    finally:
        rollout.close()
    assert [r["step"] for r in records] == [2, 3]
    after = metrics.read_bytes().splitlines(keepends=True)
    rows = [json.loads(line) for line in after]  # every line whole
    assert [r["step"] for r in rows] == [1, 2, 3] and after[0] == before[0]
    assert rows[1]["time"] > killed_at  # step 2 is the resumed run's, not the killed one's
    assert _record_steps(out) == [1, 2, 3] and _checkpoints(out)[-1] == "step_3"
    for step in (1, 2, 3):
        groups = read_jsonl(step_path(out, "train", step)).groups
        assert [g["group"] for g in groups] == [0, 1] and all(
            [s["sample"] for s in g["samples"]] == [0, 1, 2, 3] for g in groups)


def _record_steps(run: Path) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in (run / "rollouts" / "train").glob("step_*.jsonl"))


def _checkpoints(run: Path) -> list[str]:
    return sorted((p.name for p in (run / "checkpoints").glob("step_*")), key=lambda n: int(n.split("_")[1]))
