"""Imported at start-up by every Python process of the two-node test's Ray cluster (its folder is
on ``PYTHONPATH`` in both containers): the CPU stand-ins for the CUDA calls OpenRLHF 0.11.2's
policy actor, DeepSpeed strategy and replay buffer make, so that its real ``train()`` runs on
DeepSpeed's CPU accelerator (gloo). Test-only; nothing here is shipped with the package.

- ``torch.cuda``: ``set_device``/``synchronize``/``empty_cache``/``current_stream`` do nothing and
  ``current_device()`` is ``"cpu"``, so OpenRLHF's ``.to(torch.cuda.current_device())`` stays on CPU;
- the strategy's device mesh is a ``cpu`` mesh (``init_device_mesh("cuda", ...)`` upstream);
- ``NaiveReplayBuffer`` keeps its experiences on CPU (it builds ``cuda:<current_device>``);
- DeepSpeed on its CPU accelerator without building its shared-memory collective op;
- the policy in fp32 where the flags say bf16 (OpenRLHF offers only bf16 and fp16): on an AVX2
  processor without bf16 instructions one bf16 forward and backward of the tiny policy took 15x
  the fp32 time (60 s against 4 s for 2 x 356 tokens).
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from openrlhf_sgrpo.testing import after_import  # noqa: E402  (light: no torch, no vLLM)


def _cuda_on_cpu(torch):
    cuda = torch.cuda
    if cuda.is_available():
        return
    cuda.set_device = lambda *a, **k: None
    cuda.current_device = lambda: "cpu"
    cuda.synchronize = lambda *a, **k: None
    cuda.empty_cache = lambda: None
    cuda.current_stream = lambda *a, **k: None


def _cpu_mesh(module):
    upstream = module.init_device_mesh

    def init_device_mesh(device_type, *args, **kwargs):
        return upstream("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    module.init_device_mesh = init_device_mesh


def _cpu_replay_buffer(module):
    import torch

    cls = module.NaiveReplayBuffer
    upstream = cls.__init__

    @functools.wraps(upstream)
    def __init__(self, *args, **kwargs):
        saved = torch.cuda.current_device
        torch.cuda.current_device = lambda: 0  # only to build the device object it then replaces
        try:
            upstream(self, *args, **kwargs)
        finally:
            torch.cuda.current_device = saved
        self.target_device = torch.device("cpu")

    cls.__init__ = __init__


def _no_shm_comm(module):
    module.__compatible_ops__["deepspeed_shm_comm"] = False


def _fp32_dtype(module):
    import torch

    upstream = module.convert_to_torch_dtype
    module.convert_to_torch_dtype = lambda dtype: torch.float32 if dtype == "bf16" else upstream(dtype)


def _fp32_deepspeed(module):
    for name in ("get_train_ds_config", "get_eval_ds_config"):
        upstream = getattr(module, name)

        def config(*args, _upstream=upstream, **kwargs):
            cfg = _upstream(*args, **kwargs)
            cfg["bf16"]["enabled"] = False
            return cfg

        setattr(module, name, config)


after_import("torch", _cuda_on_cpu)
after_import("openrlhf.utils.utils", _fp32_dtype)
after_import("openrlhf.utils.deepspeed.deepspeed", _fp32_deepspeed)
after_import("openrlhf.utils.deepspeed.deepspeed", _cpu_mesh)
after_import("openrlhf.trainer.ppo_utils.replay_buffer", _cpu_replay_buffer)
after_import("deepspeed.ops", _no_shm_comm)
