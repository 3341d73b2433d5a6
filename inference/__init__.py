"""Inference: engines, retrievers, the Self-RAG runtime and policy."""
