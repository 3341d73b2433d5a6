"""One digest function behind every stored key: the values stay what earlier versions stored (caches keep hitting)."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

from selfrag.corpus import Query
from selfrag.data_gen.cache import call_key, default_cache_path
from selfrag.data_gen.distractors import _rng
from selfrag.fsutil import file_digest, stream_digest
from selfrag.runs import bytes_digest, text_key


def test_a_teacher_call_key_is_the_same_hash_as_before() -> None:
    messages = [{"role": "user", "content": "Qui a écrit « Candide » ?"}]
    params = {"max_tokens": 8, "temperature": 0.0, "seed": 0, "attempt": 1}
    payload = json.dumps({"model": "m", "messages": messages, "params": params}, sort_keys=True)
    assert call_key("m", messages, params) == hashlib.sha256(payload.encode("utf-8")).hexdigest()


def test_cache_file_names_and_byte_digests_keep_their_form() -> None:
    name = default_cache_path("openai", "gpt-4o-mini").name
    before = hashlib.sha256(b"openai\0gpt-4o-mini").hexdigest()[:8]
    assert name == f"openai--gpt-4o-mini--{before}.sqlite"
    assert bytes_digest(b"abc") == "sha256:" + hashlib.sha256(b"abc").hexdigest()
    assert text_key("é", 16) == hashlib.sha256("é".encode()).hexdigest()[:16] and len(text_key("x")) == 64


def test_a_question_draws_the_same_negatives_as_before() -> None:
    query = Query(id="q-1", question="Who?")
    again = random.Random(int(hashlib.sha1(b"7/hard/q-1").hexdigest()[:16], 16))
    drawn = _rng(query, "hard", 7)
    assert [drawn.random() for _ in range(5)] == [again.random() for _ in range(5)]


def test_an_index_keeps_the_corpus_digest_and_stamp_it_recorded(tmp_path: Path) -> None:
    """``selfrag index`` hashes through selfrag.runs now; an index or an unfinished build made before compares the
    same values (bare hex), so neither is rebuilt for nothing nor reused for another corpus."""
    from selfrag.inference.retrievers.index import corpus_stamp
    from selfrag.inference.retrievers.index_build import corpus_digest

    corpus = tmp_path / "docs"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_bytes(b"alpha\n" * 300_000)  # over one read block
    (corpus / "sub" / "b.md").write_bytes("# Béta\n".encode())
    old = hashlib.sha256()
    for file in (corpus / "a.txt", corpus / "sub" / "b.md"):
        old.update(f"{file.relative_to(corpus)}\0".encode() + file.read_bytes())
    assert corpus_digest(corpus) == old.hexdigest()
    single = corpus / "a.txt"
    assert corpus_digest(single) == hashlib.sha256(single.read_bytes()).hexdigest()
    assert file_digest(single) == "sha256:" + corpus_digest(single) == bytes_digest(single.read_bytes())
    assert stream_digest([b"ab", b"", b"c"]) == bytes_digest(b"abc")
    stamp = hashlib.sha256()
    for file in (corpus / "a.txt", corpus / "sub" / "b.md"):
        stat = file.stat()
        stamp.update(f"{file.relative_to(corpus)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    assert corpus_stamp(corpus) == stamp.hexdigest()
    stat = single.stat()
    assert corpus_stamp(single) == hashlib.sha256(f"\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode()).hexdigest()
    os.utime(single, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert corpus_stamp(corpus) != stamp.hexdigest()  # touched: the open-time warning fires
