from __future__ import annotations

import pytest

from selfrag import reflection as rf
from selfrag.errors import TokenizerError
from selfrag.reflection import Group, ReflectionIds


def test_vocabulary_is_the_papers_fifteen_strings() -> None:
    assert len(rf.TOKENS) == 15 and len(set(rf.TOKENS)) == 15
    assert rf.tokens_of(Group.RETRIEVE) == ("[Retrieval]", "[No Retrieval]", "[Continue to Use Evidence]")
    assert rf.tokens_of(Group.SUPPORT) == ("[Fully supported]", "[Partially supported]", "[No support / Contradictory]")
    assert rf.tokens_of(Group.UTILITY) == tuple(f"[Utility:{k}]" for k in range(1, 6))
    assert rf.tokens_of(Group.MARKUP) == ("<paragraph>", "</paragraph>")
    assert rf.utility_value("[Utility:4]") == 4
    with pytest.raises(ValueError):
        rf.utility_value("[Relevant]")


def test_tokenizer_without_reflection_tokens_is_rejected_with_the_fix(tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TokenizerError, match="tokens.strategy=add"):
        rf.reflection_ids(tiny_tokenizer)


def test_each_string_is_one_id_after_adding_them(tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    import copy

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": list(rf.TOKENS)})
    ids = rf.reflection_ids(tokenizer)
    for token in rf.TOKENS:
        assert tokenizer.encode(token, add_special_tokens=False) == [ids.id(token)]
        assert ids.token(ids.id(token)) == token
    assert ids.group_of_id(ids.id("[Relevant]")) is Group.RELEVANCE
    assert ids.group_of_id(0) is None
    assert ReflectionIds.from_json(ids.to_json()) == ids
    rf.check_ids_match(tokenizer, ids)
    shifted = ReflectionIds({token: token_id + 1000 for token, token_id in ids.token_to_id.items()})
    with pytest.raises(TokenizerError, match="differ"):
        rf.check_ids_match(tokenizer, shifted)


def test_reflection_ids_must_be_complete_and_distinct() -> None:
    with pytest.raises(TokenizerError, match="missing"):
        ReflectionIds({"[Retrieval]": 1})
    with pytest.raises(TokenizerError, match="share ids"):
        ReflectionIds(dict.fromkeys(rf.TOKENS, 7))


def test_lookalikes_are_broken_tokens_not_other_brackets() -> None:
    from selfrag.reflection import lookalikes

    text = ("Paris[Utility:7] is [1] a [citation needed] city[Fully Supported][Relevant][ retrieve ][utility: 3]"
            "[Utility:5][No Support]")
    assert lookalikes(text) == ["[Utility:7]", "[Fully Supported]", "[ retrieve ]", "[utility: 3]", "[No Support]"]
    assert lookalikes("".join(rf.TOKENS) + " [1] [a] [Paris]") == []


def test_the_retrieve_token_after_a_segment_and_the_last_of_a_group() -> None:
    ids = ReflectionIds({token: 100 + index for index, token in enumerate(rf.TOKENS)})
    assert rf.retrieve_after_segment(rf.PARAGRAPH_OPEN, True, False) == rf.RETRIEVAL
    assert rf.retrieve_after_segment(rf.CONTINUE_EVIDENCE, False, True) == rf.CONTINUE_EVIDENCE
    assert rf.retrieve_after_segment(rf.CONTINUE_EVIDENCE, False, False) == rf.NO_RETRIEVAL  # no passage to go on with
    assert rf.retrieve_after_segment(rf.RETRIEVAL, False, True) == rf.NO_RETRIEVAL  # asked, but not wanted
    assert rf.retrieve_after_segment(None, False, True) == rf.NO_RETRIEVAL
    decoded = [ids.id(rf.RETRIEVAL), 5, ids.id(rf.RELEVANT), ids.id(rf.NO_RETRIEVAL), 6, ids.id(rf.FULLY_SUPPORTED)]
    assert ids.last_of(decoded, Group.RETRIEVE) == rf.NO_RETRIEVAL
    assert ids.last_of(decoded, Group.RELEVANCE) == rf.RELEVANT and ids.last_of(decoded, Group.UTILITY) is None
