"""Model shapes without weights: ``configs/models/<name>`` holds a public architecture's ``config.json``, and the
tokenizer of that shape is built here, in code, so a GPU machine that reaches no model hub can train it.

    selfrag train --config configs/train/llama-3.1-8b-instruct-lora.yaml model=configs/models/llama-3.1-8b \\
        random_init=true records=... output_dir=...      # speed, memory and machinery at 8B; the loss means nothing
    python -m selfrag.shapes configs/models/llama-3.1-8b          # build its tokenizer now (else on first use)

A shape directory carries ``selfrag-shape.json`` (what it is, which tokenizer it takes). :func:`ensure_tokenizer`
(called by :func:`selfrag.models.resolve_model`) writes the tokenizer files into it the first time, logging it.

The ``llama-3`` tokenizer has Llama-3.1's layout: 128,000 byte-level BPE entries (Llama-3's pre-tokenizer regex;
merges learned from the shipped demo corpus and questions, then two-symbol merges in a fixed order up to exactly
128,000), then the 256 special tokens at ids 128,000-128,255 as Llama-3.1 numbers them (``<|begin_of_text|>``,
``<|eot_id|>``, ``<|start_header_id|>``, ..., and the 248 ``<|reserved_special_token_N|>`` that strategy
``reserved`` takes), and Llama-3's chat template. Its token ids are not Llama-3's: a model trained with it is only
a check of the machinery, never a model to serve.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from selfrag.errors import ModelNotFoundError

logger = logging.getLogger(__name__)

SHAPE_FILE = "selfrag-shape.json"
#: Llama-3's pre-tokenizer split (its tokenizer.json).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)
LLAMA3_BASE_VOCAB = 128_000
#: Llama-3.1's special tokens by offset from 128,000 (offsets 0-10 named, the rest reserved_special_token_3..247).
LLAMA3_NAMED = {
    0: "<|begin_of_text|>", 1: "<|end_of_text|>", 2: "<|reserved_special_token_0|>",
    3: "<|reserved_special_token_1|>", 4: "<|finetune_right_pad_id|>", 5: "<|reserved_special_token_2|>",
    6: "<|start_header_id|>", 7: "<|end_header_id|>", 8: "<|eom_id|>", 9: "<|eot_id|>", 10: "<|python_tag|>",
}
LLAMA3_SPECIAL_COUNT = 256
LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
#: The shipped text the merges are learned from (the demo's passages and questions: the text these checks train on).
TRAINING_TEXT = ("corpus.jsonl", "queries.jsonl")


def llama3_special_tokens() -> list[str]:
    """The 256 special tokens of Llama-3.1, in id order from 128,000."""
    reserved = iter(range(3, LLAMA3_SPECIAL_COUNT))
    return [LLAMA3_NAMED.get(offset) or f"<|reserved_special_token_{next(reserved)}|>"
            for offset in range(LLAMA3_SPECIAL_COUNT)]


def _texts() -> Iterator[str]:
    from importlib.resources import files

    demo = files("selfrag.data_gen.demo")  # data files shipped in the package (editable or installed alike)
    for name in TRAINING_TEXT:
        with demo.joinpath(name).open(encoding="utf-8") as lines:
            for line in lines:
                row = json.loads(line)
                yield from (str(row[key]) for key in ("title", "text", "question") if row.get(key))


def build_llama3_tokenizer() -> Any:
    """The ``llama-3`` shape tokenizer (a ``PreTrainedTokenizerFast``), deterministic for a tokenizers version."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    split = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = split
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    trainer = trainers.BpeTrainer(vocab_size=LLAMA3_BASE_VOCAB, initial_alphabet=alphabet, show_progress=False)
    learner.train_from_iterator(_texts(), trainer)
    state = json.loads(learner.to_str())["model"]
    vocab: dict[str, int] = dict(state["vocab"])
    pairs = (merge.split(" ") if isinstance(merge, str) else merge for merge in state["merges"])
    merges: list[tuple[str, str]] = [(pair[0], pair[1]) for pair in pairs]
    # fill to exactly 128,000: two-symbol merges (byte pairs, then learned token + byte) in a fixed order
    for left in [*alphabet, *sorted(vocab, key=vocab.__getitem__)]:
        if len(vocab) >= LLAMA3_BASE_VOCAB:
            break
        for right in alphabet:
            if len(vocab) >= LLAMA3_BASE_VOCAB:
                break
            if left + right not in vocab:
                vocab[left + right] = len(vocab)
                merges.append((left, right))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tokenizer.pre_tokenizer = split
    tokenizer.decoder = decoders.ByteLevel()
    specials = llama3_special_tokens()
    tokenizer.add_special_tokens(specials)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", LLAMA3_BASE_VOCAB)],
    )
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|begin_of_text|>",
                                      eos_token="<|eot_id|>", model_max_length=131072)
    wrapped.chat_template = LLAMA3_CHAT_TEMPLATE
    if len(wrapped) != LLAMA3_BASE_VOCAB + LLAMA3_SPECIAL_COUNT:
        raise RuntimeError(f"the llama-3 shape tokenizer has {len(wrapped)} entries, expected 128256")
    return wrapped


BUILDERS = {"llama-3": build_llama3_tokenizer}


def shape_of(directory: str | Path) -> dict[str, Any] | None:
    """The directory's ``selfrag-shape.json``, or None when it is not a shape directory."""
    path = Path(directory) / SHAPE_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def ensure_tokenizer(directory: str | Path) -> Path:
    """Write the shape's tokenizer into ``directory`` unless it is there (atomic: built beside, then moved in)."""
    directory = Path(directory)
    shape = shape_of(directory)
    if shape is None or not shape.get("tokenizer") or (directory / "tokenizer.json").is_file():
        return directory
    name = shape["tokenizer"]
    if name not in BUILDERS:
        raise ModelNotFoundError(f"{directory / SHAPE_FILE}: tokenizer {name!r} is not one selfrag builds; use one "
                                 f"of {sorted(BUILDERS)}")
    logger.info("%s is a model shape without weights; building its %s tokenizer into it (once, ~20 s)",
                directory, name)
    tmp = directory.parent / f".{directory.name}.tokenizer-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    BUILDERS[name]().save_pretrained(str(tmp))
    # tokenizer.json last: its presence is what says the tokenizer is complete
    for path in sorted(tmp.iterdir(), key=lambda path: path.name == "tokenizer.json"):
        os.replace(path, directory / path.name)
    shutil.rmtree(tmp, ignore_errors=True)
    return directory


def has_weights(directory: str | Path) -> bool:
    """Whether a model directory holds weight files (safetensors or PyTorch, single or sharded)."""
    directory = Path(directory)
    return any(directory.glob("*.safetensors")) or any(directory.glob("*.bin")) or any(
        directory.glob("*.safetensors.index.json"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="a shape directory (configs/models/<name>)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if shape_of(args.directory) is None:
        print(f"error: {args.directory} has no {SHAPE_FILE}; give a directory under configs/models")
        return 2
    print(ensure_tokenizer(args.directory))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
