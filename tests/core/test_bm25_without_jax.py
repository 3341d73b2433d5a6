"""BM25 never starts JAX: bm25s runs a JAX top-k at import when JAX is installed, and on a GPU machine JAX then
preallocates 75% of the card for the life of the process (105 GiB of an H200 in gpu_check's first run)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

FAKE_JAX = {
    "jax/__init__.py": "import os\nopen(os.environ['JAX_MARKER'], 'a').write('imported\\n')\n",
    "jax/lax.py": "import os\ndef top_k(scores, k):\n    open(os.environ['JAX_MARKER'], 'a').write('top_k\\n')\n",
}


def run(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    for name, text in FAKE_JAX.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    marker = tmp_path / "marker"
    env = {"PYTHONPATH": str(tmp_path), "JAX_MARKER": str(marker), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_plain_bm25s_import_would_import_jax(tmp_path: Path) -> None:
    """The premise: with a jax on the path, importing bm25s imports it and runs its top-k (JAX's backend starts)."""
    result = run(tmp_path, "import bm25s, bm25s.selection as s; print(s.JAX_IS_AVAILABLE)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
    assert (tmp_path / "marker").read_text() == "imported\ntop_k\n"


def test_selfrag_bm25_indexes_and_searches_without_importing_jax(tmp_path: Path) -> None:
    result = run(tmp_path, """
        import sys
        from selfrag.retrieval import BM25Retriever
        from selfrag.trajectory import Passage
        passages = [Passage(id=f"p{i}", title="", text=text) for i, text in
                    enumerate(["the cat sat on the mat", "dogs bark at night", "a cat and a dog"])]
        hits = BM25Retriever(passages).search("cat mat", 2)
        print([hit.passage.id for hit in hits], "jax" in sys.modules)
        import jax  # the user's own jax still imports afterwards
        print("user jax", jax.__name__)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["['p0', 'p2'] False", "user jax jax"]
    assert (tmp_path / "marker").read_text() == "imported\n"  # once: the user's import, not bm25s's
