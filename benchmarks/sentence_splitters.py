"""Sentence splitters on the shipped passages: boundary precision/recall against 150 hand-checked passages, and speed
over every shipped passage, as ratios against the regular expression data_gen used before (run beside them).

    .venv/bin/pip install pysbd syntok sentencex    # the candidates selfrag does not depend on (optional)
    .venv/bin/python benchmarks/sentence_splitters.py

Candidates: the three regular expressions selfrag had (data_gen/gold.py for answers, data_gen/distractors.py for
passages, evaluation/data.py for claims), Bling Fire as selfrag.sentences calls it (the product) and as its plain
``text_to_sentences``, pysbd, syntok and sentencex; one that is not installed is reported as such. The hand-checked
set (benchmarks/data/sentence_boundaries.jsonl; how it was made: docs/sentences.md) holds 100 passages drawn
uniformly from data_gen/demo, data_gen/slices and tests/assets/own_data, and 50 drawn from those where the
candidates disagree. A boundary is the offset where a sentence after the first starts; a candidate's sentences are
located in the text in order.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BOUNDARIES = REPO / "benchmarks" / "data" / "sentence_boundaries.jsonl"
CORPORA = (*sorted((REPO / "data_gen").glob("**/corpus.jsonl")), REPO / "tests/assets/own_data/corpus.jsonl")

Splitter = Callable[[str], list[str]]

#: The regular expressions selfrag used before selfrag.sentences (verbatim from commit 7d12181).
REGEXES = {
    "regex: data_gen/gold.py (answers)": re.compile(r"(?<=[.!?])(?<!\b[A-Z]\.)\s+(?=[\"'(\[]?[A-Z0-9])"),
    "regex: data_gen/distractors.py (passages)": re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[A-Z0-9\"'(\[])"),
    "regex: evaluation/data.py (claims)": re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])"),
}
BASELINE = "regex: data_gen/gold.py (answers)"


def _regex(pattern: re.Pattern[str]) -> Splitter:
    return lambda text: [part.strip() for part in pattern.split(text.strip()) if part.strip()]


def candidates() -> tuple[dict[str, Splitter], dict[str, str]]:
    """``({name: splitter}, {name: why it is missing})``."""
    found: dict[str, Splitter] = {name: _regex(pattern) for name, pattern in REGEXES.items()}
    missing: dict[str, str] = {}
    from selfrag.sentences import split_sentences

    found["blingfire (selfrag.sentences)"] = split_sentences
    try:
        import blingfire

        found["blingfire text_to_sentences"] = lambda text: [
            part for part in blingfire.text_to_sentences(text.strip()).split("\n") if part.strip()]
    except (ImportError, OSError) as error:
        missing["blingfire text_to_sentences"] = str(error)
    try:
        import pysbd

        segmenter = pysbd.Segmenter(language="en", clean=False)
        found["pysbd"] = lambda text: [part.strip() for part in segmenter.segment(text) if part.strip()]
    except ImportError:
        missing["pysbd"] = "pip install pysbd"
    try:
        from syntok import segmenter as syntok

        found["syntok"] = lambda text: [
            "".join(token.spacing + token.value for token in sentence).strip()
            for paragraph in syntok.process(text) for sentence in paragraph]
    except ImportError:
        missing["syntok"] = "pip install syntok"
    try:
        import sentencex

        found["sentencex"] = lambda text: [part.strip() for part in sentencex.segment("en", text) if part.strip()]
    except ImportError:
        missing["sentencex"] = "pip install sentencex"
    return found, missing


def boundaries(text: str, sentences: list[str]) -> list[int]:
    """Where each sentence after the first starts in ``text``, found in order (a sentence a splitter rewrote, e.g.
    its spaces, by its first 20 characters)."""
    starts, position = [], 0
    for sentence in sentences:
        found = text.find(sentence, position)
        found = text.find(sentence[:20], position) if found < 0 else found
        if found < 0:
            raise ValueError(f"sentence {sentence[:40]!r} not found in order in {text[:60]!r}")
        starts.append(found)
        position = found + len(sentence)
    return starts[1:]


def accuracy(splitter: Splitter, rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per stratum (``uniform``, ``disputed``, ``all``): boundary precision, recall, F1, false and missed
    boundaries, and passages split exactly right."""
    out = {}
    for stratum in ("uniform", "disputed", "all"):
        tp = fp = fn = exact = count = 0
        for row in rows:
            if stratum != "all" and row["stratum"] != stratum:
                continue
            got, gold = set(boundaries(row["text"], splitter(row["text"]))), set(row["gold"])
            tp, fp, fn = tp + len(got & gold), fp + len(got - gold), fn + len(gold - got)
            exact, count = exact + (got == gold), count + 1
        precision, recall = tp / max(1, tp + fp), tp / max(1, tp + fn)
        f1 = 2 * precision * recall / max(1e-9, precision + recall)
        out[stratum] = {"precision": precision, "recall": recall, "f1": f1, "false": fp, "missed": fn,
                        "exact": exact, "passages": count}
    return out


def speed(splitter: Splitter, texts: list[str], repeats: int) -> float:
    """Median seconds to split every text once."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for text in texts:
            splitter(text)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="speed runs per splitter (the median is reported)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args()

    rows = [json.loads(line) for line in BOUNDARIES.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [json.loads(line)["text"] for path in CORPORA for line in path.read_text(encoding="utf-8").splitlines()
             if line.strip()]
    found, missing = candidates()
    results: dict[str, Any] = {}
    for name, splitter in found.items():
        results[name] = {"accuracy": accuracy(splitter, rows), "seconds": speed(splitter, texts, args.repeats)}
    baseline = results[BASELINE]["seconds"]
    print(f"{len(rows)} hand-checked passages ({sum(r['stratum'] == 'uniform' for r in rows)} uniform, "
          f"{sum(r['stratum'] == 'disputed' for r in rows)} disputed); speed over {len(texts)} shipped passages, "
          f"median of {args.repeats}\n")
    print("| splitter | F1 all | P / R all | false / missed | exact (of 150) | F1 uniform | F1 disputed "
          "| ms per 1000 passages | time vs gold.py regex |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, result in sorted(results.items(), key=lambda item: -item[1]["accuracy"]["all"]["f1"]):
        every, seconds = result["accuracy"]["all"], result["seconds"]
        print(f"| {name} | {every['f1']:.3f} | {every['precision']:.3f} / {every['recall']:.3f} | "
              f"{every['false']} / {every['missed']} | {every['exact']} | "
              f"{result['accuracy']['uniform']['f1']:.3f} | {result['accuracy']['disputed']['f1']:.3f} | "
              f"{1000 * seconds / len(texts) * 1000:.1f} | {seconds / baseline:.1f}x |")
    for name, why in missing.items():
        print(f"| {name} | not installed: {why} | | | | | | | |")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
