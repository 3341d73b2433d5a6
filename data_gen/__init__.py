"""Data generation: inputs -> retrieve -> label -> assemble -> trajectory records.

The demo data (SQuAD v2.0 + GSM8K; see ``demo/SOURCE.md``) ships with the package::

    from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
"""

from pathlib import Path

DEMO_DIR = Path(__file__).parent / "demo"
DEMO_CORPUS = DEMO_DIR / "corpus.jsonl"
DEMO_QUERIES = DEMO_DIR / "queries.jsonl"
