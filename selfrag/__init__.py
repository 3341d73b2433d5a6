"""selfrag: reflection-token Self-RAG — data generation, LoRA training and a branching runtime."""

__version__ = "0.1.0"
