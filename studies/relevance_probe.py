"""What the *frozen* base model already tells apart: a linear probe on its hidden states, per kind of negative.

An earlier lead (the project's design notes, not kept in this repository): a logistic regression on the frozen
SmolLM2-135M's hidden states (last token and mean over the passage, layers -1, -10, -20) separated relevant from
irrelevant passages of unseen articles at AUROC 0.95 (easy) and 0.92 (hard), before anyone recorded how its hard
negatives were drawn. The judgement study found two kinds of same-article negative (studies/judgement_study.md, stop
21): a *random* passage of the article (fine-tuning reaches 0.99) and the *closest* one, the article's best BM25
match without the answer (fine-tuning stalls near 0.90). This probe asks the same of the frozen model, on the same
held-out questions the study scores, and one more thing: the verdict position comes right after ``</paragraph>``,
some 200 tokens after the question; does the frozen model separate the closest negatives better where the question
is read again after the passage?

Features per record (one forward each; causal attention, so the first read is unchanged by what follows it):
- ``after passage``: the hidden state at ``</paragraph>`` (where the trained model's verdict is read) and the mean
  over the passage's tokens, layers -1, -10 and -20;
- ``question again``: the same prompt followed by ``\\nQuestion: {question}\\nRelevant:``, the hidden state at
  its last token, plus the same passage means.
A standardised L2 logistic regression (C chosen by 5-fold cross-validation) trains on ``--train`` questions of the
training articles (gold vs closest, random-free: data_gen's gold/hard/easy records) and is scored on ``--items``
held-out questions per class, AUROC with a 95% bootstrap interval.

    python studies/relevance_probe.py [--train 600] [--items 300] [--model NAME --device cuda]

Needs ``runs/data-train``, ``runs/data-test`` and ``runs/data-test-article`` (the study's, see judgement_study.py).
Forward passes only: 3,000 records took 17 min on 2 cores (alone); the features are cached in runs/probe.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]

LAYERS = (-1, -10, -20)
OUT = REPO / "runs" / "probe"


def stable_order(key: str) -> int:
    """A question's place in the probe's fixed order: :func:`selfrag.splits.stable_hash` of its id, the order the
    study's ``select_items`` takes questions in, so probe and study score the same held-out questions."""
    from selfrag.splits import stable_hash

    return stable_hash(key)


def records_by_kind(path: Path) -> dict[str, dict[str, Any]]:
    """``{query_id: {kind: record}}`` for the answerable questions' gold, hard, easy and article records."""
    from selfrag.training.dataset import read_records

    out: dict[str, dict[str, Any]] = {}
    for record in read_records(path):
        kind = str(record.meta.get("kind"))
        if kind in ("gold", "hard", "easy", "article") and record.segments and record.segments[0].passage:
            out.setdefault(str(record.meta.get("query_id")), {})[kind] = record
    return out


def features(model: Any, tokenizer: Any, record: Any) -> tuple[np.ndarray, np.ndarray]:
    """(after-passage features, question-again features) of one record (see the module docstring)."""
    import torch

    from selfrag.prompting import encode_prompt, encode_text

    passage = record.segments[0].passage
    prompt = encode_prompt(tokenizer, record.instruction)
    opening = encode_text(tokenizer, "[Retrieval]<paragraph>")
    body = encode_text(tokenizer, passage.render())
    closing = encode_text(tokenizer, "</paragraph>")
    tail = encode_text(tokenizer, f"\nQuestion: {record.instruction}\nRelevant:")
    ids = prompt + opening + body + closing + tail
    start = len(prompt) + len(opening)
    end = start + len(body)
    at_close = end + len(closing) - 1
    with torch.no_grad():
        hidden = model(torch.tensor([ids], device=model.device), output_hidden_states=True).hidden_states
    means = [hidden[layer][0, start:end].mean(0) for layer in LAYERS]
    first = torch.cat([*(hidden[layer][0, at_close] for layer in LAYERS), *means])
    again = torch.cat([*(hidden[layer][0, -1] for layer in LAYERS), *means])
    return first.float().cpu().numpy(), again.float().cpu().numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=600, help="training-article questions (gold, hard, easy each)")
    parser.add_argument("--items", type=int, default=300, help="held-out questions per class")
    parser.add_argument("--model", default=None, help="a model alias, directory or hub id (default: the CPU default)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for a large model on a GPU (bfloat16 there)")
    args = parser.parse_args()
    for data in ("data-train", "data-test", "data-test-article"):
        if not (REPO / "runs" / data / "records.jsonl").is_file():
            raise SystemExit(f"runs/{data}/records.jsonl not found; make the study's records first "
                             "(the `selfrag generate` commands in studies/judgement_study.py)")

    import warnings

    import torch
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from tqdm import tqdm

    from selfrag.fsutil import write_json
    from selfrag.loading import load_plain_model
    from selfrag.models import DEFAULT_MODEL, resolve_model
    from selfrag.runs import text_key
    from selfrag.training.judgement import auroc, auroc_interval

    warnings.filterwarnings("ignore", category=FutureWarning, module="sklearn")  # 1.9's notices of 1.10 defaults
    torch.manual_seed(0)
    name = args.model or DEFAULT_MODEL
    path = resolve_model(name)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    model, tokenizer = load_plain_model(path, dtype, args.device)

    train = records_by_kind(REPO / "runs/data-train/records.jsonl")
    test = records_by_kind(REPO / "runs/data-test/records.jsonl")
    article = records_by_kind(REPO / "runs/data-test-article/records.jsonl")
    train_ids = [q for q in sorted(train, key=stable_order) if {"gold", "hard", "easy"} <= set(train[q])][: args.train]
    test_ids = [q for q in sorted(test, key=stable_order) if {"gold", "hard", "easy"} <= set(test[q])
                and "article" in article.get(q, {})][: args.items]

    OUT.mkdir(parents=True, exist_ok=True)
    slug = "" if args.model is None else "-" + "".join(c if c.isalnum() else "_" for c in name)[-40:]
    cache = OUT / f"features{slug}-{args.train}-{args.items}.npz"
    jobs = [("train", q, kind, train[q][kind]) for q in train_ids for kind in ("gold", "hard", "easy")]
    jobs += [("test", q, kind, test[q][kind]) for q in test_ids for kind in ("gold", "hard", "easy")]
    jobs += [("test", q, "article", article[q]["article"]) for q in test_ids]
    # the cache is this model's features of these records: other records (regenerated data) or another model recompute
    digest = text_key(name + "".join(f"{record.id}\0{record.instruction}\0{record.segments[0].passage.render()}\0"
                                     for _, _, _, record in jobs))
    started = time.time()
    saved = np.load(cache) if cache.exists() else None
    if saved is not None and str(saved["digest"]) == digest:
        first, again = saved["first"], saved["again"]
    else:
        rows = [features(model, tokenizer, record) for _, _, _, record in tqdm(jobs, desc="forward", unit="record")]
        first, again = np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
        np.savez(cache, first=first, again=again, digest=np.array(digest))
    seconds = time.time() - started

    split = np.array([job[0] for job in jobs])
    kinds = np.array([job[2] for job in jobs])
    label = (kinds == "gold").astype(int)
    result: dict[str, Any] = {"model": name, "train_questions": len(train_ids), "test_questions": len(test_ids),
                              "forward_s": round(seconds), "variants": {}}
    for name, matrix in (("after passage", first), ("question again", again)):
        for trained_on in (("hard", "easy"), ("hard",)):
            rows = (split == "train") & np.isin(kinds, ("gold", *trained_on))
            regression = LogisticRegressionCV(Cs=[1e-3, 1e-2, 1e-1, 1.0], cv=5, max_iter=3000)
            probe = make_pipeline(StandardScaler(), regression)
            probe.fit(matrix[rows], label[rows])
            scores = probe.predict_proba(matrix)[:, 1]
            gold = scores[(split == "test") & (kinds == "gold")].tolist()
            entry: dict[str, Any] = {}
            for kind in ("easy", "article", "hard"):
                negative = scores[(split == "test") & (kinds == kind)].tolist()
                low, high = auroc_interval(gold, negative)
                entry[kind] = {"auroc": auroc(gold, negative), "low": low, "high": high, "n": len(negative)}
            key = f"{name}, trained on gold vs {' + '.join(trained_on)}"
            result["variants"][key] = entry
            print(f"{key:55} " + "  ".join(f"{k} {v['auroc']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"
                                            for k, v in entry.items()))
    write_json(OUT / f"probe{slug}-{args.train}-{args.items}.json", result)
    print(json.dumps({k: v for k, v in result.items() if k != "variants"}))


if __name__ == "__main__":
    main()
