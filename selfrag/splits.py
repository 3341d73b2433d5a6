"""One stable hash for every split: held-out questions, generate's shards, the converters' test split, a fixed order.

    from selfrag.splits import in_fraction, shard_of, stable_hash
    in_fraction("squad-e3dffb6", 0.05, seed=0)   # training.eval_fraction and generate heldout: held out or not
    shard_of("squad-e3dffb6", 4)                 # generate shard=i/4
    sorted(question_ids, key=stable_hash)        # the judgement study's and the relevance probe's order

The same answer on every machine, process, Python version and file order (``hash()`` is salted per process;
SHA is not). The draws differ only by the parameters of :func:`stable_hash`, each kept as it was when its
caller was written, so no held-out set, shard or test question moved when they became one function:

=====================================  ==========================================  ==========================
caller                                 key hashed                                  use
=====================================  ==========================================  ==========================
training held-out, generate heldout    SHA-256 of ``"{seed}:{id}"``, first 8 bytes  ``/ 2**64 < fraction``
converters' ``meta.split`` (test)      SHA-256 of ``id``, first 8 bytes             ``/ 2**64 < 0.1``
generate ``shard=i/N``                 SHA-1 of ``id``, all 20 bytes                ``% N``
judgement study / relevance probe      SHA-256 of ``id``, first 8 bytes             sort key
=====================================  ==========================================  ==========================
"""

from __future__ import annotations

import hashlib
from typing import Literal

from selfrag.errors import SelfragError

Algorithm = Literal["sha256", "sha1"]
ALGORITHMS: tuple[Algorithm, ...] = ("sha256", "sha1")


class SplitError(SelfragError, ValueError):
    """A stable-hash parameter out of range (names the parameter, the value and the fix)."""


def stable_hash(key: str, seed: int | None = None, *, algorithm: Algorithm = "sha256", width: int | None = 8) -> int:
    """The integer of ``key``'s digest: ``algorithm`` over the UTF-8 of ``"{seed}:{key}"`` (``key`` alone when
    ``seed`` is None), its first ``width`` bytes big-endian (the whole digest when ``width`` is None)."""
    if algorithm not in ALGORITHMS:
        raise SplitError(f"algorithm must be one of {list(ALGORITHMS)}, got {algorithm!r}")
    text = key if seed is None else f"{seed}:{key}"
    digest = hashlib.new(algorithm, text.encode("utf-8")).digest()
    if width is not None and not 1 <= width <= len(digest):
        raise SplitError(f"width must be in [1, {len(digest)}] bytes for {algorithm}, got {width}; None takes all")
    return int.from_bytes(digest if width is None else digest[:width], "big")


#: ``meta.split`` values that mark a question for calibration or evaluation: ``generate`` never puts one into
#: ``records.jsonl`` unless ``split`` selects that very split by name (``split=all`` sends them to ``heldout.jsonl``).
HELD_SPLITS = ("dev", "test")
#: ``split=all``: every line, whatever its ``meta.split``, in every command that selects by it (generate, eval,
#: calibrate, rl, distill); never the name of a split
EVERY_SPLIT = "all"


def in_split(meta_split: object, selected: str | None) -> bool:
    """Whether a line marked ``meta_split`` is selected by ``split=selected`` (``all``, or None: every line)."""
    return selected is None or selected == EVERY_SPLIT or meta_split == selected


def kept_out(meta_split: object, selected: str) -> bool:
    """Whether a question marked ``meta_split`` stays out of the training records of ``generate split=selected``:
    a dev or test question does, unless that split was asked for by name (``split=test`` for judgement records)."""
    return meta_split in HELD_SPLITS and meta_split != selected


def in_fraction(key: str, fraction: float, seed: int | None = None) -> bool:
    """Whether ``key`` falls in the stable ``fraction`` of all keys (a larger fraction keeps every key a smaller
    one took; 0 takes none). ``seed`` draws another such subset."""
    return fraction > 0 and stable_hash(key, seed) / 2**64 < fraction


def shard_of(key: str, count: int) -> int:
    """``key``'s shard among ``count`` (generate ``shard=i/count``).

    Generate's shards were cut by SHA-1 of the bare id modulo the whole digest before the other splits existed;
    they stay so, or a run resumed or merged across the change would label some questions twice and others never.
    """
    if count < 1:
        raise SplitError(f"shard count must be at least 1, got {count}; write shard=0/1 for one shard")
    return stable_hash(key, algorithm="sha1", width=None) % count
