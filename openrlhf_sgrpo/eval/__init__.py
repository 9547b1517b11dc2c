"""Evaluate a model as a search agent: FlashRAG QA datasets (EM / F1 / search calls) and GAIA."""
