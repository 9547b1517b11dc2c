"""The single-machine runtime.

The training loop (``trainer``, ``experience_maker``, ``loss``, ``upstream``, ``rollout``,
``scripted``, ``checkpoint``, ``step_log``, ``warmup``, ``timing``) and what it shares with the
demo and with ``--engine hf`` evaluation: the batched HF engine with vLLM's ``generate`` contract
(``hf_engine``, ``sampling``), policy loading (``models``), question files (``data``) and the
loopback tool services (``services``). The GPU evaluation engine is ``openrlhf_sgrpo.engine.vllm``.
"""
