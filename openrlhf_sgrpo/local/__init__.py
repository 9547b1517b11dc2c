"""Single-machine pieces: an HF-transformers generation engine that speaks vLLM's contract."""

from openrlhf_sgrpo.local.sampling import CompletionOutput, Logprob, RequestOutput, SamplingParams

__all__ = ["CompletionOutput", "Logprob", "RequestOutput", "SamplingParams", "HFGenerationEngine"]


def __getattr__(name):
    # Lazy: importing the engine pulls in torch/transformers, which sampling users may not need.
    if name == "HFGenerationEngine":
        from openrlhf_sgrpo.local.hf_engine import HFGenerationEngine

        return HFGenerationEngine
    raise AttributeError(name)
