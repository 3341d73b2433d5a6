"""Judgement on sources a model never trained on: relevance and support AUROC per shipped source slice.

    python studies/source_transfer.py selfrag-quickstart/model            # -> <model>/transfer.json, a table
    python studies/source_transfer.py MODEL --sources nq-open,begin --items 200

Issue #33 item 1 asks that transfer be measured, not assumed. The quickstart's model trains on the demo's SQuAD
articles, GSM8K and general knowledge only, so every shipped gold slice (``data_gen/slices/``: HotpotQA, NQ-open,
RetrievalQA, BEGIN) is a source it never saw; the demo's 5 held-out SQuAD articles are the in-source reference.
Each slice is labelled by the gold labeler as the quickstart labels its own data (``selfrag generate``: the gold
passage, one easy negative from another question, one hard negative from the same article or question where the
slice has one, one support negative; ``split=all``, nothing held out), cached under ``runs/transfer/<source>``
(generate's own fingerprint refuses stale records). The model is teacher-forced on every record
(``selfrag.training.judgement.score_examples``): relevance AUROC is the ``[Relevant]`` score of the gold passages
against each negative kind's; support AUROC the ``[Fully supported]`` score of the records labelled so against those
labelled ``[No support / Contradictory]``, both after a ``[Relevant]`` passage (BEGIN's own human labels; elsewhere
the support negatives: the answer with another question's answer in the span's place). 95%
bootstrap intervals. Leaving a source out of a multi-source training (train without S, judge S) uses the same
scoring on the other model folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SLICES = REPO / "data_gen" / "slices"
SOURCES = ("hotpotqa", "nq-open", "retrievalqa", "begin")
#: the in-source reference: the demo's held-out SQuAD articles (``selfrag generate --config
#: configs/data_gen/squad-demo.yaml output=runs/data-test split=test``)
SQUAD_TEST = REPO / "runs" / "data-test"
SUPPORTED, UNSUPPORTED = "[Fully supported]", "[No support / Contradictory]"


def label_slice(source: str, output: Path, split: str = "all") -> Path:
    """The slice's gold records (generate resumes or refuses stale ones by its fingerprint), answering in whole
    sentences where the slice ships them (``answers-sentences.jsonl``: what the quickstart's recipe trains)."""
    from selfrag.config import from_dict
    from selfrag.data_gen.config import GenerateConfig
    from selfrag.data_gen.run import run

    answers = SLICES / source / "answers-sentences.jsonl"
    config = from_dict(GenerateConfig, {
        "passages": SLICES / source / "corpus.jsonl", "queries": SLICES / source / "queries.jsonl", "output": output,
        "labeler": "gold", "split": split, "heldout": 0.0, "distractors": 0, "easy_negatives": 1,
        "hard_negatives": 1, "support_negatives": 1, "article_negatives": 0, "train_abstain_text": False, "seed": 0,
        "answers": answers if answers.is_file() else None,
    })
    result = run(config)
    if result.problems:
        raise SystemExit(f"{source}: {'; '.join(result.problems)}")
    return output / "records.jsonl"


def score(model_dir: Path, records_path: Path, items: int | None = None) -> dict[str, Any]:
    """Relevance AUROC (gold vs each negative kind) and support AUROC (by the records' own support labels)."""
    import yaml

    from selfrag.config import from_dict
    from selfrag.loading import load_model
    from selfrag.training.config import TrainConfig
    from selfrag.training.dataset import read_records
    from selfrag.training.judgement import auroc, auroc_interval, score_examples, select_items
    from selfrag.training.run import judgement_set

    settings = yaml.safe_load((model_dir / "config.yaml").read_text(encoding="utf-8"))
    settings.pop("overwrite", None)
    settings["eval_records"] = records_path
    import torch

    model, tokenizer, meta = load_model(model_dir, device="cuda" if torch.cuda.is_available() else "cpu")
    records = read_records(records_path)
    # support is judged given a relevant passage: an [Irrelevant] passage's record is no support item
    support_label = {r.id: next((s.support.value for s in r.segments if s.support is not None
                                 and s.relevance is not None and s.relevance.value == "[Relevant]"), None)
                     for r in records}
    examples = judgement_set(from_dict(TrainConfig, settings), tokenizer, meta.token_ids, meta.prompt_template,
                             records=records)
    if items is not None:  # the held-out SQuAD articles have ~4,600 records: the questions select_items picks
        examples = list(select_items(examples, items))
    rows = score_examples(model, examples, meta.token_ids)

    def measure(positive: list[float], negative: list[float]) -> dict[str, Any]:
        if not positive or not negative:
            return {"auroc": None, "n_pos": len(positive), "n_neg": len(negative)}
        low, high = auroc_interval(positive, negative)
        return {"auroc": auroc(positive, negative), "low": low, "high": high, "n_pos": len(positive),
                "n_neg": len(negative)}

    gold = [r["s_rel"] for r in rows if r["kind"] == "gold" and r["s_rel"] is not None]
    kinds = sorted({str(r["kind"]) for r in rows} - {"gold", "support-negative", "None"})
    relevance = {kind: measure(gold, [r["s_rel"] for r in rows if r["kind"] == kind and r["s_rel"] is not None])
                 for kind in kinds}
    relevance["all negatives"] = measure(gold, [r["s_rel"] for r in rows if r["kind"] in kinds
                                                and r["s_rel"] is not None])
    supported = [r["s_sup"] for r in rows if r["s_sup"] is not None and support_label.get(r["id"]) == SUPPORTED]
    unsupported = [r["s_sup"] for r in rows if r["s_sup"] is not None and support_label.get(r["id"]) == UNSUPPORTED]
    return {"records": len(rows), "relevance": relevance, "support": measure(supported, unsupported)}


def cell(result: dict[str, Any]) -> str:
    if result.get("auroc") is None:
        return f"n/a ({result['n_pos']} vs {result['n_neg']})"
    return f"{result['auroc']:.3f} [{result['low']:.2f}, {result['high']:.2f}] ({result['n_pos']} vs {result['n_neg']})"


def table(results: dict[str, dict[str, Any]]) -> str:
    kinds = sorted({kind for r in results.values() for kind in r["relevance"]} - {"all negatives"})
    lines = ["| source | trained on it | relevance AUROC, all negatives | "
             + " | ".join(f"relevance vs {kind}" for kind in kinds) + " | support AUROC |",
             "| --- " * (len(kinds) + 4) + "|"]
    for source, result in results.items():
        lines.append(f"| {source} | {'yes (other articles)' if source == 'squad (held-out articles)' else 'no'} | "
                     f"{cell(result['relevance']['all negatives'])} | "
                     + " | ".join(cell(result["relevance"].get(k, {"auroc": None, "n_pos": 0, "n_neg": 0}))
                                  for k in kinds)
                     + f" | {cell(result['support'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="a folder `selfrag train` wrote (e.g. selfrag-quickstart/model)")
    parser.add_argument("--sources", default=",".join(SOURCES), help="slices of data_gen/slices, comma-separated")
    parser.add_argument("--items", type=int, default=100, help="held-out SQuAD items per class (the slices: all)")
    args = parser.parse_args(argv)
    model_dir = args.model_dir.resolve()
    if not (model_dir / "config.yaml").is_file():
        print(f"{model_dir}: no config.yaml; expected a folder `selfrag train` wrote", file=sys.stderr)
        return 2
    results: dict[str, dict[str, Any]] = {}
    if (SQUAD_TEST / "records.jsonl").is_file():
        results["squad (held-out articles)"] = score(model_dir, SQUAD_TEST / "records.jsonl", args.items)
    for source in args.sources.split(","):
        results[source] = score(model_dir, label_slice(source, REPO / "runs" / "transfer" / source))
    (model_dir / "transfer.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
