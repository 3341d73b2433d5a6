"""Which FAISS index a corpus gets when ``faiss_factory`` is unset, and the search settings that go with it.

    selfrag index corpus=psgs_w100.jsonl output=runs/wiki kind=faiss          # 21M passages: IVF4096,PQ48, re-ranked
    selfrag index corpus=data/corpus.jsonl output=runs/small kind=faiss       # 2,834 passages: Flat (exact)

Up to ``FLAT_UP_TO`` passages the index is ``Flat``: exact, memory-mapped, fast enough at that size. Above it, an
IVF-PQ index finds candidates from 8-bit product-quantizer codes (``pq_bytes`` bytes a passage, memory-mapped
inverted lists) and the best ``rerank`` of them are re-scored by the exact inner product on the float16 vectors,
read from ``vectors.f16.npy`` through a memory map: the codes and vectors are file-backed pages, so a serving
process's anonymous memory does not grow with the corpus. The defaults (``nlist`` the power of two nearest
sqrt(passages), ``pq_bytes`` = dimension / 8, ``nprobe`` 32 or 1/64 of the lists, ``rerank`` 200 growing with
sqrt(passages) above 200k) come from the measurements in docs/retrieval.md ("Which index for my corpus"),
``benchmarks/index_fits.py``. Any of them is a setting;
an explicit ``faiss_factory`` replaces the choice (and ``nlist`` / ``pq_bytes`` then have nothing to set).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from selfrag.errors import ConfigError

#: Above this many passages the picked index is IVF-PQ with re-ranking; up to it, exact Flat.
FLAT_UP_TO = 100_000
#: Inverted lists visited per query by a picked IVF-PQ index, at least (and 1/64 of the lists): at 1M passages
#: 16, 32 and 64 found 0.925, 0.930 and 0.931 of the exact top 10 with 200 candidates re-ranked.
DEFAULT_NPROBE = 32
#: Candidates re-scored exactly from the float16 vectors at 200k passages, growing with sqrt(passages) (see
#: default_rerank): 200 found 0.974 / 0.954 / 0.930 of the exact top 10 at 200k / 400k / 1M, 400 found 0.970 at 1M.
DEFAULT_RERANK = 200
_RERANK_AT = 200_000
#: FAISS wants about 39 training vectors per list (it warns below); the picker keeps lists that full.
POINTS_PER_LIST = 39
_COMPRESSED = re.compile(r"PQ|SQ|LSH|RQ", re.IGNORECASE)


@dataclass(frozen=True)
class FaissPlan:
    """What a FAISS build makes: the factory string and the search settings saved with it."""

    factory: str
    nprobe: int | None
    rerank: int


def default_nlist(passages: int) -> int:
    """The power of two nearest sqrt(passages), at least 16 and at most passages / 39 (FAISS's training minimum)."""
    nearest = 2 ** round(math.log2(max(1.0, math.sqrt(passages))))
    fullest = 2 ** int(math.log2(max(1, passages // POINTS_PER_LIST)))
    return max(1, min(max(16, nearest), fullest, 65_536))


def default_rerank(passages: int) -> int:
    """200 candidates up to 200k passages, then 200 * sqrt(passages / 200k), rounded up to 50: 450 at 1M, 2,050 at 21M.

    Product-quantized scores blur neighbours closer than their error, and a denser corpus has more of them: the
    candidates needed grew about with sqrt(passages) from 200k to 1M (measured); 21M is that trend extrapolated.
    """
    wanted = DEFAULT_RERANK * math.sqrt(max(passages, _RERANK_AT) / _RERANK_AT)
    return int(math.ceil(wanted / 50) * 50)


def default_nprobe(nlist: int) -> int:
    """32 lists, or 1/64 of them when there are more than 2,048 (64 of IVF4096 at 21M passages)."""
    return min(nlist, max(DEFAULT_NPROBE, nlist // 64))


def default_pq_bytes(dimension: int) -> int:
    """dimension / 8 (8 dimensions a one-byte code: 48 at 384, 96 at 768), the nearest divisor below otherwise."""
    for candidate in range(max(1, dimension // 8), 0, -1):
        if dimension % candidate == 0:
            return candidate
    return 1


def is_compressed(factory: str) -> bool:
    """True when the index's codes lose precision (PQ, SQ ...), so re-ranking on the exact vectors pays."""
    return bool(_COMPRESSED.search(factory))


def plan_faiss(
    factory: str | None,
    passages: int,
    dimension: int,
    nlist: int | None = None,
    pq_bytes: int | None = None,
    nprobe: int | None = None,
    rerank: int | None = None,
) -> FaissPlan:
    """The index for ``passages`` vectors of ``dimension``: ``factory`` when given, else picked by size."""
    if factory is not None:
        if nlist is not None or pq_bytes is not None:
            raise ConfigError([f"nlist/pq_bytes shape the picked index, and faiss_factory={factory} names its own; "
                               "unset them or put them in the factory string (IVF<nlist>,PQ<pq_bytes>)"])
        picked = default_rerank(passages) if is_compressed(factory) else 0
        return FaissPlan(factory, nprobe, picked if rerank is None else rerank)
    if passages <= FLAT_UP_TO and nlist is None and pq_bytes is None:
        if nprobe is not None:
            raise ConfigError([f"nprobe={nprobe} applies to IVF indexes, and {passages} passages get Flat (exact); "
                               f"unset it, or set nlist to get IVF-PQ"])
        return FaissPlan("Flat", None, 0 if rerank is None else rerank)
    lists = nlist if nlist is not None else default_nlist(passages)
    code = pq_bytes if pq_bytes is not None else default_pq_bytes(dimension)
    if dimension % code:
        raise ConfigError([f"pq_bytes={code} must divide the vectors' dimension {dimension}; "
                           f"e.g. pq_bytes={default_pq_bytes(dimension)}"])
    probes = nprobe if nprobe is not None else default_nprobe(lists)
    return FaissPlan(f"IVF{lists},PQ{code}", probes, default_rerank(passages) if rerank is None else rerank)
