"""The judgement study: which training recipe makes SmolLM2-135M's reflection tokens carry judgement on CPU.

    # 1. data: gold records of train articles, and of the 5 held-out articles (never seen in training)
    selfrag generate --config configs/data_gen/squad-demo.yaml output=runs/data-train split=train
    selfrag generate --config configs/data_gen/squad-demo.yaml output=runs/data-test split=test
    # 2. one arm = one `selfrag train` with judgement evaluation on the held-out articles
    python studies/judgement_study.py run B-words-w5-row10
    # 3. the table of every finished arm -> studies/judgement_study_table.md
    python studies/judgement_study.py table

The arms are data: ``studies/judgement_arms.yaml`` (read by ``judgement_arms.py``). Each arm is the project's own
pipeline (`selfrag train`, its recipe plus the study's common overrides and the arm's own); the judgement
(relevance AUROC vs easy / hard negatives, support AUROC with answers of the same form on both sides, 95% bootstrap
intervals) is written by training itself to ``<run>/judgement.json``. Findings: studies/judgement_study.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from judgement_arms import LOGS, REPO, RUNS, Arm, held_out_records, load_arms
from judgement_table import TABLE, table, well_formed_cell


def train_command(arm: Arm) -> list[str]:
    """The ``selfrag train`` command line of one arm (its output folder is ``runs/study/<arm>``)."""
    return [sys.executable, "-m", "selfrag.app.cli", "train", "--config", arm.recipe,
            f"output_dir={RUNS / arm.name}", *arm.overrides_in_order()]


def run_arm(arm: Arm) -> None:
    name = arm.name
    command = train_command(arm)
    LOGS.mkdir(parents=True, exist_ok=True)  # not in the output: train refuses a non-empty new output_dir
    start = time.time()
    with (LOGS / f"{name}.txt").open("w") as log:
        subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
    with (LOGS / f"{name}.txt").open("a") as log:
        log.write(f"wall_s {int(time.time() - start)}\n")


def held_out_examples(model_dir: Path) -> tuple[Any, Any, list[Any]]:
    """A trained folder's model, its ``selfrag.json`` metadata, and the arms' held-out judgement examples
    (``runs/data-test``, whatever the folder trained on) encoded with its tokenizer."""
    import yaml

    from selfrag.config import from_dict
    from selfrag.loading import load_model
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import judgement_set

    if not (model_dir / "config.yaml").is_file():
        raise SystemExit(f"{model_dir}: no config.yaml here; expected a folder `selfrag train` wrote (or an arm name)")
    settings = yaml.safe_load((model_dir / "config.yaml").read_text(encoding="utf-8"))
    settings.pop("overwrite", None)
    settings["eval_records"] = held_out_records()
    config = from_dict(TrainConfig, settings)
    model, tokenizer, meta = load_model(model_dir)
    return model, meta, judgement_set(config, tokenizer, meta.token_ids, meta.prompt_template)


def score_dir(model_dir: Path, items: int) -> Path:
    """Score any trained model folder (e.g. a quickstart's ``selfrag-quickstart/model``) on the arms' held-out
    judgement set (``runs/data-test``) -> ``<model_dir>/judgement-<items>.json``: the same items and figures as
    the arms, so a quickstart run can be set beside them."""
    from selfrag.training.judgement import headline, judge, write_report

    model, meta, examples = held_out_examples(model_dir)
    report = judge(model, examples, meta.token_ids, items)
    path = write_report(model_dir / f"judgement-{items}.json", report)
    print(f"{model_dir}: {headline(report)} ({items} items per class) -> {path}")
    return path


def score_arm(name: str, items: int) -> Path:
    """Re-score a finished arm's adapter on ``items`` held-out questions per class -> ``judgement-<items>.json``.

    Training logs the judgement on ``judgement_items`` (100 in the arms, to keep each run short); the same
    questions plus more are scored here from the saved adapter, so the final table has >= 300 items per class.
    """
    import yaml

    from selfrag.config import from_dict
    from selfrag.loading import load_model
    from selfrag.training.config import TrainConfig
    from selfrag.training.judgement import headline, judge, write_report
    from selfrag.training.run import judgement_set

    out = RUNS / name
    settings = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    settings.pop("overwrite", None)  # arms trained before `restart` replaced it
    config = from_dict(TrainConfig, settings)
    model, tokenizer, meta = load_model(out)
    examples = judgement_set(config, tokenizer, meta.token_ids, meta.prompt_template)
    start = time.time()
    report = judge(model, examples, meta.token_ids, items)
    path = write_report(out / f"judgement-{items}.json", report)
    print(f"{name}: {headline(report)} ({items} items per class, {time.time() - start:.0f} s) -> {path}")
    return path


def item_scores(model_dir: Path, items: int) -> dict[str, dict[str, object]]:
    """Per-item scores (``score_examples`` rows by record id) of a trained folder on ``items`` held-out questions
    per class, cached in ``<model_dir>/scores-<items>.json`` under the hash of its weights and the held-out
    records: a retrained folder or regenerated test data is scored again, never read from an old cache."""
    from selfrag.fsutil import write_json
    from selfrag.runs import content_digest, file_digest
    from selfrag.training.judgement import score_examples, select_items

    if not (model_dir / "config.yaml").is_file():
        raise SystemExit(f"{model_dir}: no config.yaml here; expected a folder `selfrag train` wrote (or an arm name)")
    inputs = [*sorted(model_dir.glob("*.safetensors")), REPO / held_out_records()]  # weights, held-out records
    digest = content_digest([file_digest(path) for path in inputs])  # an older cache's key differs: scored again
    cache = model_dir / f"scores-{items}.json"
    if cache.exists():
        saved = json.loads(cache.read_text(encoding="utf-8"))
        if saved.get("inputs") == digest:
            return dict(saved["rows"])
    model, meta, examples = held_out_examples(model_dir)
    rows = {str(row["id"]): row for row in score_examples(model, select_items(examples, items), meta.token_ids)}
    write_json(cache, {"inputs": digest, "items": items, "rows": rows})
    return rows


#: The held-out articles' records with one random same-article negative per question (kind ``article``):
#: ``selfrag generate --config configs/data_gen/squad-demo.yaml output=runs/data-test-article split=test
#: easy_negatives=0 support_negatives=0 article_negatives=1`` (hard_negatives=1 stays, so the draw leaves the hard
#: negative out).
ARTICLE = "runs/data-test-article/records.jsonl"
#: The held-out articles' records with the gold passage less its answer's sentences (kind ``erased``), optional:
#: ``selfrag generate --config configs/data_gen/squad-demo.yaml output=runs/data-test-erased split=test
#: easy_negatives=0 hard_negatives=0 support_negatives=0 erased_negatives=1``.
ERASED = "runs/data-test-erased/records.jsonl"


def article_records(items: int, path: str = ARTICLE, kind: str = "article") -> list[Any]:
    """The ``article`` records (a random passage of the question's own article without the answer, drawn by
    data_gen) of the questions whose ``hard`` records ``select_items`` scores: the same questions, two draws."""
    from selfrag.training.dataset import read_records
    from selfrag.training.judgement import select_items

    if not (REPO / ARTICLE).is_file():
        raise SystemExit(
            f"{ARTICLE} not found; make it with: selfrag generate --config configs/data_gen/squad-demo.yaml "
            "output=runs/data-test-article split=test easy_negatives=0 support_negatives=0 article_negatives=1"
        )
    held_out = read_records(REPO / held_out_records())
    rows = [{"id": r.id, "kind": str(r.meta.get("kind")), "query_id": str(r.meta.get("query_id"))} for r in held_out]
    questions = {str(row["query_id"]) for row in select_items(rows, items) if row["kind"] == "hard"}
    return [r for r in read_records(REPO / path) if r.meta.get("kind") == kind
            and str(r.meta.get("query_id")) in questions]


def negatives(name: str, items: int) -> dict[str, Any]:
    """Relevance AUROC of one arm (or trained folder) against two kinds of same-article negatives of the same
    questions: ``hard`` (the article's best BM25 match without the answer) and ``article`` (a random passage of the
    article without the answer, :data:`ARTICLE`); and against ``easy`` ones. Gold scores are shared
    (``item_scores``)."""
    import yaml

    from selfrag.config import from_dict
    from selfrag.loading import load_model
    from selfrag.training.config import TrainConfig
    from selfrag.training.judgement import auroc, auroc_interval, score_examples
    from selfrag.training.run import judgement_set

    folder = RUNS / name if (RUNS / name).is_dir() else Path(name).resolve()
    scores = item_scores(folder, items)
    settings = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    settings.pop("overwrite", None)
    settings["eval_records"] = held_out_records()
    model, tokenizer, meta = load_model(folder)
    examples = judgement_set(from_dict(TrainConfig, settings), tokenizer, meta.token_ids, meta.prompt_template,
                             records=article_records(items))
    random_rows = score_examples(model, examples, meta.token_ids)
    gold = [float(row["s_rel"]) for row in scores.values() if row["kind"] == "gold" and row["s_rel"] is not None]
    kinds = [("hard (BM25-best, data_gen)", [float(row["s_rel"]) for row in scores.values() if row["kind"] == "hard"]),
             ("article (random same-article)", [float(row["s_rel"]) for row in random_rows]),
             ("easy (other article)", [float(row["s_rel"]) for row in scores.values() if row["kind"] == "easy"])]
    if (REPO / ERASED).is_file():  # the gold passage less its answer's sentences, for the same questions
        erased = judgement_set(from_dict(TrainConfig, settings), tokenizer, meta.token_ids, meta.prompt_template,
                               records=article_records(items, ERASED, "erased"))
        kinds.append(("erased (gold less the answer)", [float(row["s_rel"]) for row in
                                                         score_examples(model, erased, meta.token_ids)]))
    result: dict[str, Any] = {}
    for kind, negative in kinds:
        low, high = auroc_interval(gold, negative)
        result[kind] = {"auroc": auroc(gold, negative), "low": low, "high": high, "n_pos": len(gold),
                        "n_neg": len(negative)}
        print(f"{name}: gold vs {kind:30} AUROC {result[kind]['auroc']:.3f} [{low:.3f}, {high:.3f}] "
              f"({len(gold)} vs {len(negative)})")
    return result


def compare(first: str, second: str, items: int) -> dict[str, dict[str, object]]:
    """Two arms (or trained folders) on the same ``items`` questions per class: each AUROC and a paired-bootstrap
    95% interval of ``second - first`` for relevance vs easy and hard negatives and for support."""
    from paired_bootstrap import paired_auroc_difference

    def folder(name: str) -> Path:
        return RUNS / name if (RUNS / name).is_dir() else Path(name).resolve()

    a, b = item_scores(folder(first), items), item_scores(folder(second), items)
    result = {
        "relevance easy": paired_auroc_difference(a, b, "gold", "easy"),
        "relevance hard": paired_auroc_difference(a, b, "gold", "hard"),
        "support": paired_auroc_difference(a, b, "gold", "support-negative", score="s_sup"),
    }
    print(f"{second} - {first}, {items} items per class, paired bootstrap (1,000 resamples):")
    for name, r in result.items():
        print(
            f"  {name:15} {r['a']:.3f} -> {r['b']:.3f}  difference {r['difference']:+.3f} "
            f"[{r['low']:+.3f}, {r['high']:+.3f}]  P(not better) {r['p_not_better']:.3f}  "
            f"({r['n_pos']} vs {r['n_neg']})"
        )
    return result


def query_kind(query: Any) -> str:
    """The quickstart's kinds of demo question (``interleave`` takes them in turn): no-retrieval, answerable or
    unanswerable. The quickstart's own is private; this is the same rule, read from the query's fields."""
    if query.needs_retrieval is False:
        return "no-retrieval"
    return "answerable" if query.answerable else "unanswerable"


def answers_arm(name: str, questions: int, plain: bool = False, data: Path | None = None) -> Path:
    """Does the arm's model also *answer*? ``selfrag eval`` single-pass on held-out demo questions (the quickstart's
    test questions: answerable, unanswerable and no-retrieval ones interleaved) -> ``<run>/answers/results.json``."""
    from selfrag.app.quickstart import interleave
    from selfrag.config import from_dict
    from selfrag.corpus import load_queries
    from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
    from selfrag.evaluation.config import EvalConfig
    from selfrag.evaluation.data import query_to_row
    from selfrag.evaluation.run import run as evaluate
    from selfrag.jsonl import write_jsonl_atomic

    held_out = interleave([q for q in load_queries(DEMO_QUERIES) if q.meta.get("split") == "test"], query_kind)
    data = data or RUNS / "answers-questions.jsonl"  # each of several runs at once gives its own (one writer a file)
    write_jsonl_atomic(data, [query_to_row(query) for query in held_out[12:][:questions]])  # after the dev 12
    out = RUNS / name / "answers"
    result = evaluate(from_dict(EvalConfig, {"data": data, "model": str(RUNS / name),
                                             "retriever": {"corpus": DEMO_CORPUS}, "output_dir": out, "batch_size": 4,
                                             "modes": ["single_pass", "plain_rag"] if plain else ["single_pass"],
                                             "plots": False, "show": 0}))
    print(result.table)
    print(f"well-formed single-pass outputs: {well_formed_cell(out.parent)}")
    return out / "results.json"


def main() -> None:
    arms = load_arms()
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run", help="train one arm (see studies/judgement_arms.yaml)")
    one.add_argument("arm", choices=sorted(arms))
    rescore = sub.add_parser("score", help="re-score finished arms' adapters on more held-out items per class")
    rescore.add_argument("arms", nargs="+", choices=sorted(arms))
    rescore.add_argument("--items", type=int, default=300)
    anyone = sub.add_parser("score-dir", help="score any trained model folder on the arms' held-out items")
    anyone.add_argument("model_dir", type=Path)
    anyone.add_argument("--items", type=int, default=100)
    pair = sub.add_parser("compare", help="two arms (or trained folders) on the same items: paired AUROC differences")
    pair.add_argument("first")
    pair.add_argument("second")
    pair.add_argument("--items", type=int, default=300)
    kinds = sub.add_parser("negatives", help="one arm's relevance AUROC vs BM25-best and random same-article negatives")
    kinds.add_argument("arm", help="an arm name or a trained folder")
    kinds.add_argument("--items", type=int, default=300)
    answer = sub.add_parser("answers", help="single-pass answers of finished arms on held-out questions (selfrag eval)")
    answer.add_argument("arms", nargs="+", choices=sorted(arms))
    answer.add_argument("--questions", type=int, default=30)
    answer.add_argument("--with-plain", action="store_true", help="also plain RAG on the base model (a reference)")
    sub.add_parser("table", help="write studies/judgement_study_table.md from runs/study/*/judgement*.json")
    args = parser.parse_args()
    if args.command == "run":
        run_arm(arms[args.arm])
    elif args.command == "answers":
        os.chdir(REPO)
        for arm in args.arms:
            answers_arm(arm, args.questions, args.with_plain)
    elif args.command == "compare":
        os.chdir(REPO)
        compare(args.first, args.second, args.items)
    elif args.command == "negatives":
        os.chdir(REPO)
        negatives(args.arm, args.items)
    elif args.command == "score-dir":
        model_dir = args.model_dir.resolve()
        os.chdir(REPO)
        score_dir(model_dir, args.items)
    elif args.command == "score":
        os.chdir(REPO)  # the arms' config.yaml name their records relative to the repository
        for arm in args.arms:
            score_arm(arm, args.items)
    else:
        text = table(arms)
        TABLE.write_text(text, encoding="utf-8")
        print(text)


if __name__ == "__main__":
    main()
