"""OpenRLHF 0.11.2's own training options with our estimators, SAPO and CalibAdv, on the real-Ray
path: OpenRLHF's vLLM engine (``create_vllm_engines`` → ``RolloutRayActor``, vLLM's CPU build), its
``SamplesGenerator``, ``PPOTrainerAsync`` (generator and training actors), our agent against the
real retriever and sandbox, and our experience maker. The table "OpenRLHF options with our
estimators" in docs/openrlhf_options.md points here (and to ``tests/test_cli.py`` for the refused combinations).

One engine for the module (~1 min to start on 2 cores); each test builds its trainer actors, or the
experience maker in this process, with its own options (``option_args``). Where CUDA blocks:
- ``make_experience``'s actor and reference forwards are OpenRLHF's own ``Actor`` wrapped around a
  CPU HF model, in this process (:class:`CpuForwardGroup` stands where the Ray actor group is);
- ``ActorPPOTrainer.training_step`` (SAPO-patched, as our policy actor builds it) runs here with a
  namespace for DeepSpeed's strategy (plain autograd, no optimizer step), as in ``test_sapo.py``;
- the policy actor that syncs weights to vLLM holds a plain HF model (``cluster_world``).
A loopback gate in front of the real retriever (:class:`RetrieverGate`) holds search requests, so a
test can stop agents between a tool call and its observation by construction.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
import time
import urllib.request
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
import torch

pytest.register_assert_rewrite("cluster_world")  # its checks report like this module's
from cluster_world import (
    CORPUS,
    check_engine_contract,
    cpu_actor_trainer,
    experiences_of,
    generator_batch,
    needs_vllm,
    policy_log_probs,
    scramble_,
    single_process_group,
    trainer_kwargs,
    turn_ranges,
)
from fitted_policy import QUESTIONS, TEMPLATE

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("openrlhf_gpu_stubs")]
# workdir, policy_dir, services, agent_func_path, cluster, engines: this module's own
pytest_plugins = ("cluster_world",)

from cluster_world import ALPHA, MAX_LEN, MAX_TURNS, N, TEMPERATURE, TOKENS_PER_TURN  # noqa: E402
ESTIMATORS = ("stratified_grpo", "stratified_rloo", "stratified_reinforce")
(SEARCH_Q, _), (CODE_Q, _), (ANSWER_Q, _) = QUESTIONS
# A one-word gold no answer can reach: an answer is one turn of at most TOKENS_PER_TURN tokens,
# and no token of the policy's vocabulary is longer than 128 characters (16 x 128 < 2,200), so its
# F1 (and EM) is 0 by construction.
UNREACHABLE = "zq" * 1100
# Either name the fitted policy answers the third question with scores F1 2/3 against this gold
# (one of its two words); a group's mean is then strictly between 0 and 1.
BOTH_NAMES = ("Shakespeare Marlowe", "Marlowe Shakespeare")
CORPUS_TITLES = [p["contents"].split("\n")[0].strip('"') for p in CORPUS]


# ----------------------------------------------------------------------------- the retriever gate

class RetrieverGate:
    """A pass-through proxy in front of the real retriever that can hold every ``/retrieve`` request
    until opened: an agent whose search is held waits between its tool call and its observation.
    With ``fault`` set it stands for a broken retriever instead: ``"drop"`` closes the connection
    without a byte (the process died mid-request), ``"garbage"`` answers 200 with a body outside
    Search-R1's schema."""

    FAULTS = (None, "drop", "garbage")

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self._open = threading.Event()
        self._open.set()
        self._seen = threading.Condition()
        self.held = 0  # requests that arrived while closed
        self.queries: list[str] = []  # every query forwarded
        self.fault: str | None = None
        self.faulted = 0  # requests answered with the fault
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if gate.fault is not None:
                    gate.faulted += 1
                    if gate.fault == "drop":
                        self.close_connection = True
                        return
                    self._answer(200, b'{"unexpected": "shape"}')
                    return
                gate.arrive(json.loads(body or b"{}").get("queries", []))
                request = urllib.request.Request(gate.upstream, data=body,
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=120) as resp:
                    self._answer(resp.status, resp.read())

            def _answer(self, status: int, answer: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/retrieve"

    def arrive(self, queries: list[str]) -> None:
        with self._seen:
            self.queries.extend(queries)
            if not self._open.is_set():
                self.held += 1
            self._seen.notify_all()
        self._open.wait(timeout=600)

    def close(self) -> None:
        with self._seen:
            self.held = 0
            self._open.clear()

    def open(self) -> None:
        self._open.set()

    def wait_held(self, count: int, timeout_s: float = 300) -> None:
        with self._seen:
            if not self._seen.wait_for(lambda: self.held >= count, timeout=timeout_s):
                raise TimeoutError(f"{self.held} of {count} search requests reached the gate in {timeout_s} s")

    def stop(self) -> None:
        self.open()
        self.server.shutdown()
        self.server.server_close()


# ----------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def gate(services):
    g = RetrieverGate(services.retriever_url)
    yield g
    g.stop()


def write_dataset(path, rows: list[tuple[str, str]]) -> str:
    path.write_text("".join(json.dumps({"question": q, "answers": [g]}) + "\n" for q, g in rows))
    return str(path)


@pytest.fixture(scope="module")
def base_argv(workdir, policy_dir, agent_func_path) -> list[str]:
    """The module's command line: the engine's settings (rollout log-probs on, for the IS
    correction) and one prompt group per micro-batch half, as in ``test_cluster_ray.py``."""
    return [
        "--actor.model_name_or_path", str(policy_dir), "--train.agent_func_path", agent_func_path,
        "--data.prompt_dataset", write_dataset(workdir / "train.jsonl", QUESTIONS),
        "--data.input_key", "question", "--data.label_key", "answers",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "2",
        "--vllm.num_engines", "1", "--vllm.enforce_eager",
        "--data.max_len", str(MAX_LEN), "--rollout.max_new_tokens", str(TOKENS_PER_TURN),
        "--rollout.temperature", str(TEMPERATURE),
        "--rollout.batch_size", str(len(QUESTIONS)), "--rollout.n_samples_per_prompt", str(N),
        "--rollout.micro_batch_size", "2", "--train.batch_size", str(len(QUESTIONS) * N),
        "--train.micro_batch_size", "2", "--algo.kl.init_coef", "0",
        "--algo.advantage.estimator", "stratified_grpo", "--algo.advantage.sgrpo_alpha", str(ALPHA),
        "--algo.advantage.is_correction_level", "token", "--algo.sapo.enable",
        "--ckpt.path", str(workdir / "ckpt"),
    ]


@pytest.fixture(scope="module")
def args(workdir, services, gate, base_argv):
    """The agent searches through the gate; F1 rewards (graded: a group's mean can sit strictly
    between 0 and 1 by construction); a search may wait at the gate for minutes."""
    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config

    config = workdir / "agent_config.yaml"
    config.write_text(f"retriever_url: {gate.url}\nsandbox_url: {services.sandbox_url}\n"
                      f"template: {TEMPLATE}\nmax_turns: {MAX_TURNS}\ntopk: 2\nmax_obs_tokens: 48\n"
                      f"max_tokens_per_turn: {TOKENS_PER_TURN}\nreward: f1\nrequest_timeout_s: 600\n")
    os.environ["SGRPO_AGENT_CONFIG"] = str(config)  # forwarded to every Ray worker by ray_runtime_env()
    return parse_config(base_argv)


@pytest.fixture(scope="module")
def option_args(base_argv):
    """The module's command line plus a test's options (argparse: the last value wins)."""
    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config

    return lambda *extra: parse_config([*base_argv, *extra])


@pytest.fixture(scope="module")
def tokenizer(policy_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(policy_dir)


@pytest.fixture(scope="module")
def trainer(cluster, args, engines):
    """OpenRLHF's sync trainer actor on the module's command line, its SamplesGenerator serving the
    batches of the tests below one after another (each actor start is ~10 s of imports)."""
    from openrlhf.trainer.ppo_trainer import PPOTrainer
    from openrlhf.utils import get_strategy

    actor = PPOTrainer.remote(args.actor.model_name_or_path, get_strategy(args), None, None, None, None, engines,
                              **trainer_kwargs(args))
    yield actor
    cluster.kill(actor)


@pytest.fixture(scope="module")
def batch(cluster, trainer) -> list:
    """One rollout of the three questions (searches, code, answers) from OpenRLHF's SamplesGenerator
    in its trainer actor: the Experience samples the options below turn into experiences."""
    samples, _ = cluster.get(trainer.__ray_call__.remote(generator_batch))
    assert len(samples) == len(QUESTIONS) * N
    return samples


def load_policy(policy_dir, scrambled: bool = False):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    if scrambled:
        scramble_(model)
    return model


def mildly_changed(policy_dir):
    """The fitted policy with its last MLP scaled by 0.8: a nearby policy (a reference, an
    updated actor), so KL terms and importance ratios are finite and far from 0."""
    model = load_policy(policy_dir)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layers.1.mlp" in name:
                p.mul_(0.8)
    return model


@pytest.fixture(scope="module")
def fitted(policy_dir):
    """The fitted policy as the trainer's CPU model, loaded once for the module. The option tests
    below only read it: their training step runs with lr 0 (``cpu_training_step``)."""
    return load_policy(policy_dir)


@pytest.fixture(scope="module")
def nearby(policy_dir):
    """:func:`mildly_changed`, loaded once for the module (read only, as ``fitted``)."""
    return mildly_changed(policy_dir)


@pytest.fixture(scope="module")
def batch_log_probs(batch, fitted, nearby) -> dict[str, list[torch.Tensor]]:
    """The trainer's fp32 log-probs of every sample of ``batch`` under ``fitted`` and ``nearby``:
    the reference values the KL tests compare OpenRLHF's numbers with. Each forward over the
    152k-token vocabulary costs ~0.1 s a sample on 2 cores; computed once, not once per option."""
    return {name: [policy_log_probs(model, s.sequences[0].tolist(), TEMPERATURE) for s in batch]
            for name, model in (("fitted", fitted), ("nearby", nearby))}


@pytest.fixture(scope="module")
def stale_experiences(batch, option_args, tokenizer, nearby) -> list:
    """``batch`` made into experience by a trainer whose weights moved since the engine sampled it
    (``nearby``): an async-style stale batch. Made once for the IS-correction tests: OpenRLHF
    0.11.2's ``make_experience`` reads none of the flags they vary (``--algo.advantage.is_correction_*``,
    ``--actor.policy_loss_type``, ``--actor.loss_agg_mode``: they act in the policy loss), so each
    test's own maker would build the same experiences."""
    return make_maker(option_args(), tokenizer, actor=nearby).make_experience_batch(copy.deepcopy(batch))


# ------------------------------------------------------------------------- experience helpers

_FORWARDS: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def _digest(value) -> object:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        return (tuple(t.shape), str(t.dtype), hashlib.sha1(t.numpy().tobytes()).hexdigest())
    return repr(value)


def _detached_copy(out):
    """Log-probs, or (log-probs, HF output) as ``return_output=True`` gives them: detached copies,
    the output without its logits (``[batch, length, 152k]`` floats)."""
    if isinstance(out, torch.Tensor):
        return out.detach().clone()
    log_probs, output = out
    output = copy.copy(output)
    for k in list(output.keys()):
        output[k] = None if k == "logits" else (
            output[k].detach().clone() if isinstance(output[k], torch.Tensor) else output[k])
    return _detached_copy(log_probs), output


def forward_once(actor):
    """OpenRLHF's ``Actor`` (as built here) whose forward runs once per model, temperature and
    input, then answers from memory. The option tests send the same samples through the same two
    read-only models (``fitted``, ``nearby``) under a dozen option sets, and each forward over the
    152k-token vocabulary costs ~0.4 s a sample on 2 cores: what they vary happens after it (the KL
    terms, the IS correction, the losses). The first call of each kind is the real one; an answer
    from memory is a detached copy of it, without the logits (``training_step`` reads only the
    output's ``aux_loss`` and ``entropy``). A weight changed in place makes a new key."""
    memo = _FORWARDS.setdefault(actor.model, {})
    real = actor.forward
    weights = lambda: tuple(p._version for p in actor.model.parameters())

    def forward(*args, **kwargs):
        key = (weights(), actor.temperature, actor.training, torch.is_grad_enabled(),
               tuple(_digest(a) for a in args), tuple(sorted((k, _digest(v)) for k, v in kwargs.items())))
        if key in memo:
            return _detached_copy(memo[key])
        out = real(*args, **kwargs)
        memo[key] = _detached_copy(out)
        return out

    actor.forward = forward
    return actor


class CpuForwardGroup:
    """Where ``make_experience`` dispatches to the actor / reference ``RayActorGroup``: the same
    forward as ``PolicyModelActor.forward`` (OpenRLHF's ``Actor`` in eval mode, no grad, the
    rollout temperature), run in this process on CPU (once per input: :func:`forward_once`);
    results come back through the object store."""

    def __init__(self, model, temperature: float) -> None:
        from openrlhf.models import Actor

        self.actor = forward_once(Actor(model, temperature=temperature))
        self.actor.packing_samples = False  # set only when Actor loads the model itself

    def async_run_method_batch(self, method_name: str, sequences, action_mask, attention_mask, **_):
        import ray

        assert method_name == "forward"
        self.actor.eval()
        with torch.no_grad():
            out = [self.actor(s, m, attention_mask=a) for s, m, a in zip(sequences, action_mask, attention_mask)]
        return [ray.put(out)]

    def async_run_method(self, method_name: str, **_):
        import ray

        return [ray.put(None)]  # empty_cache


def make_maker(args, tokenizer, actor=None, reference=None, kl_ctl=None):
    """Our experience maker in this process, built as our trainer actors build it."""
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
    from openrlhf.utils import get_strategy

    from openrlhf_sgrpo.openrlhf_ext.experience_maker import StratifiedExperienceMaker

    wrap = lambda m: None if m is None else CpuForwardGroup(m, args.rollout.temperature)
    return StratifiedExperienceMaker(wrap(actor), None, None, wrap(reference),
                                     kl_ctl or FixedKLController(args.algo.kl.init_coef), get_strategy(args), tokenizer)


def by_sample(experiences) -> dict[int, tuple]:
    """sample index -> (experience, row)."""
    return {i: (e, row) for e in experiences for row, i in enumerate(e.index)}


def info_column(samples, key: str) -> torch.Tensor:
    return torch.cat([torch.as_tensor(s.info[key]).reshape(-1) for s in samples]).float()


def expected_scalar(args, samples, rewards=None) -> torch.Tensor:
    """The estimator on the samples' own rewards and strata, in the order the generator returned them."""
    from openrlhf_sgrpo.advantages import compute_stratified
    from openrlhf_sgrpo.openrlhf_ext.config import sgrpo_options
    from openrlhf_sgrpo.strata import parse_stratify_by, strata_from_info

    opts = sgrpo_options(args)
    keys = parse_stratify_by(opts.stratify_by)
    rewards = torch.cat([s.rewards for s in samples]).float() if rewards is None else rewards
    strata = strata_from_info({k: info_column(samples, k) for k in keys}, keys, cap=opts.strata_cap)
    return compute_stratified(opts.estimator, rewards, strata, args.rollout.n_samples_per_prompt, opts.alpha,
                              opts.eps, opts.std).float()


def check_groups_and_advantages(args, samples, experiences) -> None:
    """Prompt groups whole and contiguous; every sample once; its counters and strata in ``info``
    as the agent wrote them; the scalar advantage the estimator's on its own group."""
    from agent_env import info_keys as K
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import ADVANTAGE_INFO_KEY

    n = args.rollout.n_samples_per_prompt
    assert len(samples) % n == 0
    for g in range(len(samples) // n):
        assert len({(s.prompts[0], str(s.labels[0])) for s in samples[g * n:(g + 1) * n]}) == 1
    rows = by_sample(experiences)
    assert sorted(rows) == list(range(len(samples)))
    want = expected_scalar(args, samples)
    for i, (e, row) in rows.items():
        assert float(e.info[ADVANTAGE_INFO_KEY][row]) == pytest.approx(float(want[i]), abs=1e-5)
        for key in (K.TOOL_CALLS, K.SEARCH_CALLS, K.CODE_CALLS, K.TURNS):
            assert float(e.info[key][row]) == float(samples[i].info[key][0]), key
        assert not any(K.is_turn_slot_key(k) for k in e.info)


def action_columns(e, row) -> torch.Tensor:
    return e.action_mask[row].bool()


# ------------------------------------------------------------------------------ generation tests

def _filtering_batch(generator):
    """Inside the sync trainer: one batch with dynamic filtering, and what the generator counted."""
    samples, pass_rate, consumed, exhausted = generator.samples_generator.generate_samples(**generator.generate_kwargs)
    return samples, pass_rate, consumed, exhausted


@needs_vllm
def test_dynamic_filtering_replaces_whole_groups(cluster, engines, option_args, workdir, tokenizer):
    """``--algo.dynamic_filtering_enable``: a prompt whose group's mean score is outside the range is
    dropped with its whole group and a new prompt is sent in its place. Three prompts have an
    unreachable gold (mean 0: dropped), two a gold either answer half-matches (mean in (0, 1): kept);
    three go out first, so at least one is replaced, by construction. The batch holds the two kept
    groups whole, each sample with its own strata and counters, and every estimator (with CalibAdv)
    gives each its group's advantage."""
    from openrlhf.trainer.ppo_trainer import PPOTrainer
    from openrlhf.utils import get_strategy

    kept = [(ANSWER_Q, g) for g in BOTH_NAMES]
    dropped = [(SEARCH_Q, UNREACHABLE), (CODE_Q, UNREACHABLE), (ANSWER_Q, UNREACHABLE + "x")]
    data = write_dataset(workdir / "filtering.jsonl", [*dropped, *kept])
    args = option_args("--data.prompt_dataset", data, "--algo.dynamic_filtering_enable",
                       "--rollout.batch_size", "3", "--train.batch_size", str(3 * N))
    assert tuple(args.algo.dynamic_filtering_range) == (0, 1)  # upstream's default: drop all-0 and all-1 groups
    trainer = PPOTrainer.remote(args.actor.model_name_or_path, get_strategy(args), None, None, None, None, engines,
                                **trainer_kwargs(args))
    try:
        samples, pass_rate, consumed, exhausted = cluster.get(trainer.__ray_call__.remote(_filtering_batch))
    finally:
        cluster.kill(trainer)
    assert consumed == 5 and exhausted  # every dropped prompt was replaced until the data ran out
    assert len(samples) == len(kept) * N
    assert {str(s.labels[0]) for s in samples} == {str([g]) for _, g in kept}
    assert pass_rate == pytest.approx(100 * len(samples) / consumed)  # upstream counts samples per prompt
    for g in range(len(kept)):  # what the filter let through: a mean score strictly inside (0, 1)
        assert 0 < sum(float(s.scores[0]) for s in samples[g * N:(g + 1) * N]) / N < 1
    for estimator in ESTIMATORS:
        opts = option_args("--algo.dynamic_filtering_enable", "--algo.advantage.estimator", estimator,
                           "--algo.calibadv.enable", "--algo.calibadv.scored_rollouts", "all")
        experiences = experiences_of(make_maker(opts, tokenizer), copy.deepcopy(samples))
        check_groups_and_advantages(opts, samples, experiences)
        assert all("calibadv/scored_share" in e.info for e in experiences)


def _search_samples(samples) -> list:
    from agent_env import info_keys as K

    return [s for s in samples if float(s.info[K.SEARCH_CALLS][0]) >= 1]


@needs_vllm
def test_a_broken_retriever_mid_rollout_costs_no_sample(cluster, args, trainer, gate, tokenizer):
    """The retriever breaks while OpenRLHF's engine runs our agent: first it drops every connection
    (a process that died mid-request), then it answers 200 with a body outside the schema; then it
    is back. Each broken batch still holds every prompt group whole (N samples, in order), every
    search of it became an observation the policy sees ("search failed: ...") and is counted
    (tool_errors = search_errors + code_errors); the search still counts as a call for the strata;
    the batch after the fault searches normally. The bound is the agent's HTTP policy: a dropped
    connection is retried with backoff, a bad body is not retried, neither waits for a timeout."""
    from agent_env import info_keys as K
    from agent_env.tools.http import HttpPolicy

    def one_batch():
        start = time.monotonic()
        samples, _ = cluster.get(trainer.__ray_call__.remote(generator_batch))
        return samples, time.monotonic() - start

    policy = HttpPolicy()
    times = {}
    try:
        for fault in ("drop", "garbage"):
            gate.fault, gate.faulted = fault, 0
            samples, times[fault] = one_batch()
            assert len(samples) == len(QUESTIONS) * N
            check_groups_and_advantages(args, samples, experiences_of(make_maker(args, tokenizer), copy.deepcopy(samples)))
            searched = _search_samples(samples)
            # the search question searches by construction; the agent sends concurrent queries in
            # batches, so the gate counts requests, not searches
            assert searched and gate.faulted >= 1, fault
            for s in searched:
                info = {k: float(v[0]) for k, v in s.info.items()}
                assert info[K.SEARCH_ERRORS] == info[K.SEARCH_CALLS] >= 1, (fault, info)
                assert info[K.TOOL_ERRORS] == info[K.SEARCH_ERRORS] + info[K.CODE_ERRORS]
                assert info[K.TOOL_CALLS] == info[K.SEARCH_CALLS] + info[K.CODE_CALLS]  # a failed call is a call
                assert "search failed" in tokenizer.decode(s.sequences[0]), fault
    finally:
        gate.fault = None
    samples, times["back"] = one_batch()
    searched = _search_samples(samples)
    assert searched and all(float(s.info[K.SEARCH_ERRORS][0]) == 0 for s in searched)
    assert all("<information>" in tokenizer.decode(s.sequences[0]) for s in searched)
    # a dropped connection costs each call at most the policy's backoffs (a trajectory makes at most
    # MAX_TURNS calls, trajectories run side by side), never a timeout; 60 s for a busy 2-core box
    assert times["drop"] < times["back"] + MAX_TURNS * policy.backoff_total_s() + 60, times
    print(f"rollout seconds by retriever state: {times}")


@needs_vllm
def test_async_queue_and_oversampling_serve_whole_groups(cluster, engines, option_args, workdir, tokenizer):
    """``--train.async_enable --train.async_queue_size 2 --rollout.vllm_generate_batch_size 2``:
    PPOTrainerAsync's generator samples two prompts in one vLLM call and serves them as two
    one-prompt batches, both queued before any training step (two batches ahead of the weights,
    the most the queue allows); each batch is one whole group, and the training actor's experience
    maker (ours) gives every sample its group's advantage."""
    from openrlhf.trainer.ppo_trainer_async import PPOTrainerAsync
    from openrlhf.utils import get_strategy

    data = write_dataset(workdir / "async.jsonl", [QUESTIONS[0], QUESTIONS[2]])
    args = option_args("--data.prompt_dataset", data, "--train.async_enable", "--train.async_queue_size", "2",
                       "--rollout.batch_size", "1", "--rollout.vllm_generate_batch_size", "2",
                       "--train.batch_size", str(N))
    trainer = PPOTrainerAsync.remote(args.actor.model_name_or_path, get_strategy(args), None, None, None, None,
                                     engines, **trainer_kwargs(args))
    actors = [trainer]
    try:
        queue, slots, generator, training = cluster.get(trainer.__ray_call__.remote(
            lambda t: (t.rollout_queue, t.rollout_slots, t.generator_actor, t.trainer_actor)))
        actors += [generator, training]
        fit = generator.fit.remote(episode=0, total_consumed_prompts=0)
        deadline = time.monotonic() + 600
        while queue.qsize() < 2:  # no training step consumes: the generator runs ahead alone
            assert time.monotonic() < deadline, "the generator did not queue two batches"
            time.sleep(0.2)
        assert slots.qsize() == 0  # both slots taken: the queue's whole depth is in use
        payloads = []
        for step in range(2):  # what TrainingActor.fit does with each payload: free its slot
            payloads.append(queue.get(timeout=300))
            slots.put(step + 1)
        assert queue.get(timeout=300) == "done"
        cluster.get(fit)
        batches = [p[0] for p in payloads]
        # one vLLM call of two prompts: the second batch comes from the generator's buffer
        assert [p[1]["total_consumed_prompts"] for p in payloads] == [2, 2]
        assert [len(b) for b in batches] == [N, N]
        assert len({b[0].prompts[0] for b in batches}) == 2
        for b in batches:
            made = cluster.get(training.__ray_call__.remote(lambda t, b=b: experiences_of(t.experience_maker, b)))
            check_groups_and_advantages(args, b, made)
        for estimator in ESTIMATORS[1:]:
            opts = option_args("--train.async_enable", "--algo.advantage.estimator", estimator,
                               "--algo.calibadv.enable", "--algo.calibadv.scored_rollouts", "all")
            for b in batches:
                check_groups_and_advantages(opts, b, experiences_of(make_maker(opts, tokenizer), copy.deepcopy(b)))
    finally:
        for actor in actors:
            cluster.kill(actor)


def _install_cpu_policy(actor, args, policy_dir: str, engines) -> bool:
    """Inside a policy actor: its ``ActorPPOTrainer`` around the fitted policy (a plain HF model
    where DeepSpeed's engine would be), so ``PolicyModelActor.broadcast_to_vllm`` syncs it."""
    from transformers import AutoModelForCausalLM

    single_process_group()
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    actor.trainer = cpu_actor_trainer(args, model, vllm_engines=engines)
    actor.saved_weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return True


def _scramble_policy(actor) -> None:
    scramble_(actor.trainer.actor.model.module)


def _restore_policy(actor) -> None:
    with torch.no_grad():
        for name, p in actor.trainer.actor.model.module.named_parameters():
            p.copy_(actor.saved_weights[name])


def _mean_abs_gap(lp_model: torch.Tensor, lp_engine: list[float], cols: list[int]) -> float:
    return float((lp_model[cols] - torch.tensor([lp_engine[c] for c in cols])).abs().mean())


@needs_vllm
def test_partial_rollout_pause_between_tool_call_and_observation(cluster, args, engines, option_args, workdir,
                                                                  gate, policy_dir, tokenizer):
    """``--train.partial_rollout_enable``: the async training actor's weight sync pauses vLLM
    (``pause_generation(mode="keep")``), syncs, resumes, without the generator's lock. Agents are held
    at the retriever gate (between their search and its observation) while it runs with new
    weights: every episode then finishes with its tool calls, counts, observation and turn ranges
    intact; each search episode's next turn was sampled with the new weights (its rollout log-probs
    are the new policy's), at least one first turn with the old ones. The agent's state lives in its
    coroutine inside the engine's actor, which the pause does not touch."""
    import openrlhf.cli.train_ppo_ray as upstream_cli
    from openrlhf.trainer.ppo_trainer_async import PPOTrainerAsync
    from openrlhf.trainer.ray.launcher import RayActorGroup
    from openrlhf.utils import get_strategy

    from agent_env import info_keys as K

    data = write_dataset(workdir / "partial.jsonl", [QUESTIONS[0]])
    pargs = option_args("--data.prompt_dataset", data, "--train.async_enable", "--train.partial_rollout_enable",
                        "--rollout.batch_size", "1", "--train.batch_size", str(N))
    group = RayActorGroup(1, 1, upstream_cli.PolicyModelActor, pg=None, num_gpus_per_actor=1)
    (policy,) = group._actor_handlers
    trainer = PPOTrainerAsync.remote(pargs.actor.model_name_or_path, get_strategy(pargs), group, None, None, None,
                                     engines, **trainer_kwargs(pargs))
    actors, scrambled = [trainer, policy], False
    queries_before = len(gate.queries)
    try:
        assert cluster.get(policy.__ray_call__.remote(_install_cpu_policy, pargs, str(policy_dir), engines))
        generator, training = cluster.get(trainer.__ray_call__.remote(lambda t: (t.generator_actor,
                                                                                 t.trainer_actor)))
        actors += [generator, training]
        gate.close()
        rollout = generator.__ray_call__.remote(generator_batch)
        gate.wait_held(1)  # an agent is now between its search and the observation
        cluster.get(policy.__ray_call__.remote(_scramble_policy))
        scrambled = True
        cluster.get(training.broadcast_to_vllm.remote())  # pause (keep) -> sync -> resume
        gate.open()
        samples, consumed = cluster.get(rollout)
        made = cluster.get(training.__ray_call__.remote(lambda t: experiences_of(t.experience_maker, samples)))
    finally:
        gate.open()
        try:
            if scrambled:  # the module's other tests sample with the fitted weights
                cluster.get(policy.__ray_call__.remote(_restore_policy))
                cluster.get(policy.broadcast_to_vllm.remote())
        finally:
            for actor in actors:
                cluster.kill(actor)
    assert consumed == 1 and len(samples) == N
    assert cluster.get(engines[0].get_num_unfinished_requests.remote()) == 0

    raw = [{"sequence": s.sequences[0].tolist(), "action_mask": s.action_mask[0].tolist(),
            "rollout_log_probs": s.rollout_log_probs[0].tolist(),
            "info": {k: float(v[0]) for k, v in s.info.items()}} for s in samples]
    check_engine_contract(raw, tokenizer, max_len=MAX_LEN, max_turns=MAX_TURNS, tokens_per_turn=TOKENS_PER_TURN)
    # the tool calls and their counts survived: every query the gate saw belongs to one episode's search
    assert sum(r["info"][K.SEARCH_CALLS] for r in raw) == len(gate.queries) - queries_before >= 1
    old, new = load_policy(policy_dir), load_policy(policy_dir, scrambled=True)
    first_turn_old, later_gaps = [], []
    for r in raw:
        turns = turn_ranges(r["info"], MAX_TURNS)
        kinds = [kind for kind, _, _ in turns]
        assert r["info"][K.TOOL_CALLS] == kinds.count("search") + kinds.count("code")
        assert r["info"][K.TURNS] == len(turns)
        if kinds[0] != "search":
            continue
        assert len(turns) >= 2  # the episode went on after its observation
        observation = tokenizer.decode(r["sequence"][turns[0][2]:turns[1][1]])
        assert "<information>" in observation and any(f'"{d}"' in observation for d in CORPUS_TITLES)
        lp_old, lp_new = (policy_log_probs(m, r["sequence"], TEMPERATURE) for m in (old, new))
        cols0 = list(range(turns[0][1] - 1, turns[0][2] - 1))
        first_turn_old.append(_mean_abs_gap(lp_old, r["rollout_log_probs"], cols0))
        later = [c for _, start, end in turns[1:] for c in range(start - 1, end - 1)]
        later_gaps.append((_mean_abs_gap(lp_new, r["rollout_log_probs"], later),
                           _mean_abs_gap(lp_old, r["rollout_log_probs"], later)))
    assert later_gaps, "no episode searched"
    # Turns after the observation came from the new weights: far nearer to them than to the old.
    # The engine computes in bf16 and this check in fp32; with the scrambled weights' large logits
    # that alone leaves a gap to the new policy of < 0.1 nats a token where bf16 is emulated
    # (AVX2) but 0.65-1.6 with native AVX-512 BF16 kernels, against ~27 to the old policy on both.
    for gap_new, gap_old in later_gaps:
        assert gap_old > 10 and gap_old > 5 * gap_new, later_gaps
    assert min(first_turn_old) < 0.1, first_turn_old  # the held agent's search came from the old ones
    check_groups_and_advantages(pargs, samples, made)


# --------------------------------------------------------------- options on the experience maker

@needs_vllm
@pytest.mark.parametrize("estimator, kl_estimator, extra", [
    ("stratified_grpo", "k1", []), ("stratified_grpo", "k2", []),
    ("stratified_grpo", "k3", ["--algo.kl.target", "0.01"]),
    ("stratified_rloo", "k3", []), ("stratified_reinforce", "k1", []),
    ("stratified_reinforce", "k3", ["--algo.advantage.no_std_norm"]),
])
def test_kl_in_the_reward_through_upstreams_make_experience(batch, option_args, tokenizer, fitted, nearby,
                                                            batch_log_probs, estimator, kl_estimator, extra):
    """``--algo.kl.init_coef > 0`` without ``--algo.kl.use_loss`` (``--algo.kl.estimator k1|k2|k3``,
    ``--algo.kl.target``: adaptive coefficient): upstream's ``make_experience`` computes the per-token
    KL to the reference; our advantages are OpenRLHF's token returns of it: the stratified advantage
    at the last action token minus coef x the KL of every later action token, tool tokens out.
    ``stratified_reinforce`` then whitens them over the batch's action tokens
    (``--algo.advantage.no_std_norm``: centres them only)."""
    from openrlhf.trainer.ppo_utils.kl_controller import AdaptiveKLController

    from openrlhf_sgrpo.openrlhf_ext.experience_maker import ADVANTAGE_INFO_KEY

    coef = 0.05
    args = option_args("--algo.advantage.estimator", estimator, "--algo.kl.init_coef", str(coef),
                       "--algo.kl.estimator", kl_estimator, *extra)
    actor, reference = fitted, nearby
    kl_ctl = None
    if args.algo.kl.target:  # a coefficient the controller moved (as after a step), not the initial one
        kl_ctl = AdaptiveKLController(coef, args.algo.kl.target, args.algo.kl.horizon)
        kl_ctl.update(current=0.5, n_steps=1000)
        assert kl_ctl.value != coef
    maker = make_maker(args, tokenizer, actor=actor, reference=reference, kl_ctl=kl_ctl)
    experiences = maker.make_experience_batch(copy.deepcopy(batch))
    value = maker.kl_ctl.value
    want = expected_scalar(args, batch)
    rows, raw_token_adv, got_token_adv, masks = by_sample(experiences), [], [], []
    for i, (e, row) in rows.items():
        d = batch_log_probs["fitted"][i] - batch_log_probs["nearby"][i]
        kl = {"k1": d, "k2": d.pow(2) / 2, "k3": (-d.clamp(min=-10)).exp() - 1 + d.clamp(min=-10)}[kl_estimator]
        kl = kl.clamp(-10, 10)
        mask = action_columns(e, row)[: len(kl)]
        assert float(e.info["kl"][row]) == pytest.approx(float(kl[mask].mean()), abs=1e-4)
        assert float(e.info[ADVANTAGE_INFO_KEY][row]) == pytest.approx(float(want[i]), abs=1e-5)
        # return at action token t: A + sum over action tokens t' >= t of -coef * kl(t')
        penalty = torch.flip(torch.cumsum(torch.flip(torch.where(mask, -value * kl, 0.0), [0]), 0), [0])
        raw_token_adv.append((want[i] + penalty)[mask])
        got_token_adv.append(e.advantages[row][: len(kl)][mask].float())
        masks.append(mask)
    raw, got = torch.cat(raw_token_adv), torch.cat(got_token_adv)
    if args.algo.advantage.no_std_norm:  # centred over the batch's action tokens, not scaled
        assert torch.allclose(got, raw - raw.mean(), atol=1e-4)
    elif estimator == "stratified_reinforce":  # whitened over the batch's action tokens afterwards
        assert float(got.mean()) == pytest.approx(0.0, abs=1e-4)
        assert float(got.std(unbiased=False)) == pytest.approx(1.0, abs=1e-3)
        slope, intercept = torch.linalg.lstsq(torch.stack([raw, torch.ones_like(raw)], 1), got[:, None]).solution[:, 0]
        assert float(slope) > 0 and torch.allclose(slope * raw + intercept, got, atol=1e-3)
    else:
        assert torch.allclose(got, raw, atol=1e-4)
    assert float((raw - torch.cat([want[i].expand(int(m.sum())) for i, m in zip(rows, masks)])).abs().max()) > 1e-4


def cpu_training_step(args, model, experiences, kl_coef: float = 0.0) -> tuple[dict, torch.Tensor]:
    """One ``ActorPPOTrainer.training_step`` (SAPO-patched, as our policy actor builds it) on the
    replay buffer's batch of these experiences, in this process: DeepSpeed's strategy is a
    namespace whose backward only records the loss and whose optimizer step does nothing."""
    from openrlhf.models import Actor
    from openrlhf.trainer.ppo_utils.experience import (
        make_experience_batch,
        remove_padding_in_sequences,
        split_experience_batch,
    )
    from openrlhf.trainer.ray import ppo_actor

    from openrlhf_sgrpo.openrlhf_ext.sapo_actor import install_sapo_patch

    install_sapo_patch()
    items = [it for e in experiences for it in remove_padding_in_sequences(split_experience_batch(e))]
    losses = []
    strategy = SimpleNamespace(args=args, ring_attn_group=None,
                               backward=lambda loss, m, o: losses.append(loss.detach()),
                               optimizer_step=lambda *a, **k: None, get_grad_norm=lambda m: 0.0,
                               all_reduce=lambda x: x, is_rank_0=lambda: True)
    actor = forward_once(Actor(model, temperature=args.rollout.temperature))
    actor.packing_samples = False
    optim = torch.optim.SGD(model.parameters(), lr=0.0)
    saved = (ppo_actor.torch_dist_barrier_and_cuda_sync, ppo_actor.NaiveReplayBuffer)
    try:  # cpu_actor_trainer replaces these two module globals; this process runs other tests
        trainer = cpu_actor_trainer(args, actor, strategy=strategy,
                                    scheduler=torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 1.0))
    finally:
        ppo_actor.torch_dist_barrier_and_cuda_sync, ppo_actor.NaiveReplayBuffer = saved
    status = trainer.training_step(make_experience_batch(items), kl_coef, 0)
    return status["metrics"], losses[0]


@needs_vllm
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_kl_loss_as_the_launch_scripts_set_it(batch, option_args, tokenizer, fitted, nearby, batch_log_probs,
                                              estimator):
    """``--algo.kl.use_loss --algo.kl.estimator k3 --algo.kl.init_coef 0.001`` (the paper scripts):
    the advantages carry no KL; the reference's log-probs ride to the actor, whose KL loss (k3 on
    action tokens only) is added to the policy loss and SAPO's term."""
    coef = 0.001
    args = option_args("--algo.advantage.estimator", estimator, "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
                       "--algo.kl.init_coef", str(coef))
    actor, reference = fitted, nearby
    experiences = make_maker(args, tokenizer, actor=actor, reference=reference).make_experience_batch(
        copy.deepcopy(batch))
    plain = experiences_of(make_maker(args, tokenizer), copy.deepcopy(batch))
    plain_rows, k3_sum, tokens = by_sample(plain), 0.0, 0
    for i, (e, row) in by_sample(experiences).items():
        p, prow = plain_rows[i]
        assert torch.allclose(e.advantages[row], p.advantages[prow], atol=1e-5)  # no KL in the advantages
        seq = batch[i].sequences[0].tolist()
        mask = action_columns(e, row)[: len(seq) - 1]
        lp_ref = batch_log_probs["nearby"][i]
        assert torch.allclose(e.base_action_log_probs[row][: len(seq) - 1][mask], lp_ref[mask], atol=1e-4)
        d = (batch_log_probs["fitted"][i] - lp_ref)[mask].clamp(min=-10)
        k3_sum, tokens = k3_sum + float(((-d).exp() - 1 + d).clamp(-10, 10).sum()), tokens + int(mask.sum())
    metrics, loss = cpu_training_step(args, actor, experiences, kl_coef=coef)
    assert float(metrics["kl"]) == pytest.approx(k3_sum / tokens, rel=1e-3)
    # the SAPO-wrapped policy loss (its term included) plus coef x the KL loss
    assert float(loss) == pytest.approx(float(metrics["policy_loss"]) + coef * float(metrics["kl"]), rel=1e-4,
                                        abs=1e-7)


IS_CORRECTIONS = [
    ("token", "mask", "ratio", ["0.5", "5.0"]),  # ICEPOP
    ("token", "clip", "ratio", ["0.5", "5.0"]),  # TIS
    ("seq", "mask", "ratio", ["0.5", "5.0"]),  # seq-mask-TIS
    ("token", "mask", "binary_kl", ["0.05"]),
    ("seq", "mask", "binary_kl", ["0.05"]),  # FlashREINFORCE's trust region
    ("token", "mask", "tv", ["0.2"]),
    ("seq", "mask", "tv", ["0.2"]),
]


@needs_vllm
@pytest.mark.parametrize("level, mode, gating, threshold, loss_flags", [
    *[(*c, []) for c in IS_CORRECTIONS],
    (*IS_CORRECTIONS[0], ["--actor.policy_loss_type", "gspo"]),
    (*IS_CORRECTIONS[2], ["--actor.policy_loss_type", "gspo"]),
    (*IS_CORRECTIONS[0], ["--actor.loss_agg_mode", "seq-mean-token-mean"]),
])
def test_is_correction_on_a_stale_batch_reads_action_tokens_only(option_args, nearby, stale_experiences,
                                                                 level, mode, gating, threshold, loss_flags):
    """``--algo.advantage.is_correction_level/mode/gating/threshold`` on an async-style stale batch:
    sampled by the engine with the fitted weights, turned into experience by a trainer whose weights
    moved since (old log-probs). The correction compares the engine's per-turn log-probs with the
    trainer's on action tokens only: the placeholders on tool tokens change nothing. SAPO's ratio is
    the update's drift from the trainer's weights, not the staleness: 1 on the first step, term 0."""
    args = option_args("--algo.advantage.is_correction_level", level, "--algo.advantage.is_correction_mode", mode,
                       "--algo.advantage.is_correction_gating", gating,
                       "--algo.advantage.is_correction_threshold", *threshold, *loss_flags)
    trainer_weights, experiences = nearby, copy.deepcopy(stale_experiences)
    metrics, loss = cpu_training_step(args, trainer_weights, experiences)
    gap = torch.cat([(e.rollout_log_probs - e.action_log_probs)[e.action_mask.bool()] for e in experiences])
    assert float(gap.abs().mean()) > 1e-2  # the batch is stale: the correction has work to do
    if args.actor.policy_loss_type == "ppo":  # (GSPO takes the rollout ratio but reports no vllm_kl)
        assert float(metrics["vllm_kl"]) == pytest.approx(float(gap.mean()), rel=1e-4)
    assert float(metrics["sapo/mean_ratio"]) == pytest.approx(1.0, abs=1e-5)
    assert float(metrics["sapo/term"]) == pytest.approx(0.0, abs=1e-7)
    tampered = copy.deepcopy(experiences)
    for e in tampered:  # what a misplaced observation log-prob would do
        e.rollout_log_probs = torch.where(e.action_mask.bool(), e.rollout_log_probs, torch.full_like(
            e.rollout_log_probs, -30.0))
    metrics2, loss2 = cpu_training_step(args, trainer_weights, tampered)
    assert float(loss2) == pytest.approx(float(loss), rel=1e-6, abs=1e-9)
    for key in ("vllm_kl", "is_filter_ratio", "policy_loss"):
        if key in metrics:
            assert float(metrics2[key]) == pytest.approx(float(metrics[key]), rel=1e-6, abs=1e-9), key


@needs_vllm
def test_dynamic_batch_and_packing_keep_every_sample_its_advantage(batch, option_args, tokenizer):
    """``--train.dynamic_batch_enable`` (``--rollout.max_tokens_per_gpu``; it turns on
    ``--ds.packing_samples``): upstream splits the rollout into length-balanced micro-batches whose
    samples come from any group, and re-balances them across ranks after the advantages. Every
    estimator, with CalibAdv, gives each sample the same token advantages as with plain
    micro-batches, and balancing keeps them with their samples. Packing acts in the actor's
    forward only (flash-attn varlen, GPU); the experience maker's batch is the same."""
    from openrlhf.trainer.ppo_utils.experience import balance_experiences

    from openrlhf_sgrpo.openrlhf_ext.experience_maker import ADVANTAGE_INFO_KEY

    longest = max(int(s.total_length[0]) for s in batch)
    for estimator in ESTIMATORS:
        common = ["--algo.advantage.estimator", estimator, "--algo.calibadv.enable",
                  "--algo.calibadv.scored_rollouts", "all"]
        plain_args = option_args(*common)
        dyn_args = option_args(*common, "--train.dynamic_batch_enable", "--rollout.max_tokens_per_gpu",
                               str(2 * longest), "--train.max_tokens_per_gpu", str(2 * longest))
        assert dyn_args.ds.packing_samples
        plain = by_sample(experiences_of(make_maker(plain_args, tokenizer), copy.deepcopy(batch)))
        dynamic = experiences_of(make_maker(dyn_args, tokenizer), copy.deepcopy(batch))
        assert len(dynamic) >= 2 and sorted(i for e in dynamic for i in e.index) == list(range(len(batch)))
        check_groups_and_advantages(dyn_args, batch, dynamic)
        keyed = []
        for i, (e, row) in by_sample(dynamic).items():
            p, prow = plain[i]
            width = int(batch[i].action_mask.shape[1])
            assert torch.allclose(e.advantages[row][:width], p.advantages[prow][:width], atol=1e-5)
            keyed.append((tuple(batch[i].sequences[0].tolist()), round(float(e.info[ADVANTAGE_INFO_KEY][row]), 5),
                          tuple(round(float(a), 5) for a in e.advantages[row][:width])))
        balanced = balance_experiences(dynamic, dyn_args)
        after = []
        for e in balanced:
            for row in range(len(e.sequences)):
                seq = e.sequences[row][e.attention_mask[row].bool()].tolist()
                width = len(seq) - 1
                after.append((tuple(seq), round(float(e.info[ADVANTAGE_INFO_KEY][row]), 5),
                              tuple(round(float(a), 5) for a in e.advantages[row][:width])))
        assert sorted(after) == sorted(keyed)


@needs_vllm
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_length_penalties_and_reward_clip_range(batch, option_args, tokenizer, estimator):
    """``--reward.overlong_buffer_len/overlong_penalty_factor`` count the action tokens of every turn,
    never the tool tokens between them (OpenRLHF #1243); ``--reward.stop_properly_penalty_coef`` acts
    on trajectories whose last turn hit its token limit; ``--reward.clip_range`` clips the stratified
    advantage, as it clips upstream's group-normalized reward, before the KL term. The range here has
    a positive floor so that it binds by construction: every group's advantages sum to 0, so some
    sample of each group sits at or below 0."""
    from agent_env import info_keys as K
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import ADVANTAGE_INFO_KEY

    budget, factor, low, high, stop = 64, 0.5, 0.1, 10.0, -0.5
    args = option_args("--algo.advantage.estimator", estimator, "--rollout.max_new_tokens", str(budget),
                       "--reward.overlong_buffer_len", str(budget), "--reward.overlong_penalty_factor", str(factor),
                       "--reward.stop_properly_penalty_coef", str(stop), "--reward.clip_range", str(low), str(high))
    actions = torch.tensor([float(s.action_mask[0].sum()) for s in batch])
    spans = torch.tensor([float(s.response_length[0]) for s in batch])
    assert bool((spans > actions).any())  # tool turns: the first-to-last span holds observations
    assert info_column(batch, K.ACTION_TOKENS).tolist() == actions.tolist()
    rewards = torch.cat([s.rewards for s in batch]).float() - actions.clamp(max=budget) / budget * factor
    truncated = torch.tensor([bool(s.truncated[0]) for s in batch])  # the last turn hit its token limit
    rewards = torch.where(truncated, torch.tensor(stop), rewards)  # a negative coef replaces the reward
    want = expected_scalar(args, batch, rewards=rewards)
    experiences = experiences_of(make_maker(args, tokenizer), copy.deepcopy(batch))
    clipped = False
    for i, (e, row) in by_sample(experiences).items():
        assert float(e.info["reward"][row]) == pytest.approx(float(rewards[i]), abs=1e-5)
        assert float(e.info[ADVANTAGE_INFO_KEY][row]) == pytest.approx(float(want[i]), abs=1e-5)
        assert int(e.response_length[row]) == int(spans[i])  # upstream's length, restored
        if estimator != "stratified_reinforce":  # (whitened afterwards)
            tokens = e.advantages[row][action_columns(e, row)]
            assert torch.allclose(tokens, want[i].clamp(low, high).expand_as(tokens), atol=1e-5)
            clipped |= float(want[i]) < low
    assert clipped or estimator == "stratified_reinforce"


def test_upstream_actor_methods_with_zero_argument_super_are_reached_through_our_classes():
    """Ray ships an actor class by value with a wrapper around each of its methods; an upstream
    method of a ``@ray.remote`` class that calls ``super()`` travels as a copy naming a copy of its
    class, which our subclass (imported in the worker) does not derive from. Each such method must
    be overridden in our subclass (so it travels by reference): ``TrainingActor.broadcast_to_vllm``
    raised TypeError at the first weight sync of every async run before it was."""
    import inspect
    import sys

    import ray

    from openrlhf_sgrpo.openrlhf_ext import actors

    checked = 0
    for ours in (actors.SGRPOPPOTrainerImpl, actors.SGRPOTrainingActorImpl, actors.SGRPOPPOTrainerAsyncImpl,
                 actors.SGRPOPolicyModelActorImpl):
        for upstream in ours.__mro__[1:]:
            home = sys.modules.get(upstream.__module__)
            if not isinstance(getattr(home, upstream.__name__, None), ray.actor.ActorClass):
                continue  # a plain class: its methods travel by reference
            for name, fn in vars(upstream).items():
                if name != "__init__" and inspect.isfunction(fn) and "__class__" in fn.__code__.co_freevars:
                    checked += 1
                    assert name in vars(ours), f"{ours.__name__} must override {upstream.__name__}.{name}"
    assert checked >= 1  # TrainingActor.broadcast_to_vllm
