"""One digest function behind every stored key: the values stay what earlier versions stored (caches keep hitting)."""

from __future__ import annotations

import hashlib
import json
import random

from selfrag.corpus import Query
from selfrag.data_gen.cache import call_key, default_cache_path
from selfrag.data_gen.distractors import _rng
from selfrag.runs import bytes_digest, text_key


def test_a_teacher_call_key_is_the_same_hash_as_before() -> None:
    messages = [{"role": "user", "content": "Qui a écrit « Candide » ?"}]
    params = {"max_tokens": 8, "temperature": 0.0, "seed": 0, "attempt": 1}
    payload = json.dumps({"model": "m", "messages": messages, "params": params}, sort_keys=True)
    assert call_key("m", messages, params) == hashlib.sha256(payload.encode("utf-8")).hexdigest()


def test_cache_file_names_and_byte_digests_keep_their_form() -> None:
    name = default_cache_path("openai", "gpt-4o-mini").name
    legacy = hashlib.sha256(b"openai\0gpt-4o-mini").hexdigest()[:8]
    assert name == f"openai--gpt-4o-mini--{legacy}.sqlite"
    assert bytes_digest(b"abc") == "sha256:" + hashlib.sha256(b"abc").hexdigest()
    assert text_key("é", 16) == hashlib.sha256("é".encode()).hexdigest()[:16] and len(text_key("x")) == 64


def test_a_question_draws_the_same_negatives_as_before() -> None:
    query = Query(id="q-1", question="Who?")
    again = random.Random(int(hashlib.sha1(b"7/hard/q-1").hexdigest()[:16], 16))
    drawn = _rng(query, "hard", 7)
    assert [drawn.random() for _ in range(5)] == [again.random() for _ in range(5)]
