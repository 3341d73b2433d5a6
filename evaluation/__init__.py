"""Evaluation: compare no-retrieval, plain RAG, prompted-critic and single-pass Self-RAG on the same data.

    selfrag eval --config configs/eval/demo.yaml model=selfrag-quickstart/model
    selfrag calibrate --config configs/eval/demo.yaml model=selfrag-quickstart/model
"""
