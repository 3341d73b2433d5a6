"""Issue #55's transfer study: its question sets never overlap training, and its table pools seeds pairwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transfer

from selfrag.evaluation.data import load_examples


def test_the_question_sets_are_eval_files_that_no_training_slice_holds() -> None:
    trained = set()
    repo = Path(transfer.REPO)
    for path in [repo / "data_gen" / "demo" / "queries.jsonl", repo / "data_gen" / "demo" / "general-knowledge.jsonl",
                 *(repo / "data_gen" / "slices").glob("*/queries.jsonl")]:
        trained |= {json.loads(line)["question"].strip().lower() for line in path.open(encoding="utf-8")}
    for name in (*transfer.DEV, *transfer.TEST):
        examples = load_examples(transfer.SETS / f"{name}.jsonl", "auto", None, None)
        assert len(examples) >= 40
        assert not {example.question.strip().lower() for example in examples} & trained, name
        assert all(len(example.ctxs) == 3 for example in examples)
        for example in examples:  # answerable exactly when a passage holds a gold string, and those are the gold
            assert example.answerable == bool(example.gold_passage_ids)


def test_dev_and_test_sets_share_no_question() -> None:
    sets = {name: {json.loads(line)["question"].strip().lower()
                   for line in (transfer.SETS / f"{name}.jsonl").open(encoding="utf-8")}
            for name in (*transfer.DEV, *transfer.TEST)}
    assert len(sets["popqa-dev"]) == 57
    for name in transfer.DEV:
        for other in transfer.TEST:
            assert not sets[name] & sets[other], (name, other)


def write_arm(folder: Path, mode: str, answers: dict[str, str]) -> None:
    rows = [{"question": q, "answer": a, "answerable": True, "gold_answers": ["Paris"], "kind": "qa",
             "abstained": a == "The sources do not say.", "hedged": False, "retrieved": True, "engine_calls": 1,
             "prompt_tokens": 1, "generated_tokens": 1, "seconds": 1.0, "claims": []} for q, a in answers.items()]
    (folder / "records").mkdir(parents=True)
    (folder / "records" / f"{mode}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "results.json").write_text("{}")


def write_seed(out: Path, seed: int, right: int) -> None:
    """One seed's PopQA rows in its own --out: plain RAG right on all 4, fine-tuned RAG on none, single-pass on the
    first ``right`` (abstaining on the rest)."""
    questions = [f"q{i}" for i in range(4)]
    write_arm(out / "plain" / "popqa", "plain_rag", dict.fromkeys(questions, "Paris."))
    folder = out / f"seed-{seed}" / "evals" / "popqa"
    write_arm(folder / "ft-rag", "ft_rag", {q: "Lyon." for q in questions})
    write_arm(folder / "sft", "single_pass",
              {q: ("Paris." if i < right else "The sources do not say.") for i, q in enumerate(questions)})


def write_seeds(out: Path, rights: dict[int, int]) -> list[str]:
    """Seeds in one --out: plain RAG right on all 4 PopQA questions (written once), per seed fine-tuned RAG on none
    and single-pass on the first ``rights[seed]``; the questions."""
    questions = [f"q{i}" for i in range(4)]
    write_arm(out / "plain" / "popqa", "plain_rag", dict.fromkeys(questions, "Paris."))
    for seed, right in rights.items():
        folder = out / f"seed-{seed}" / "evals" / "popqa"
        write_arm(folder / "ft-rag", "ft_rag", {q: "Lyon." for q in questions})
        write_arm(folder / "sft", "single_pass",
                  {q: ("Paris." if i < right else "The sources do not say.") for i, q in enumerate(questions)})
    return questions


def test_the_table_pools_seeds_and_pairs_each_question_within_its_seed(tmp_path: Path) -> None:
    write_seeds(tmp_path, {0: 1, 1: 3})
    table = transfer.table([tmp_path])
    rows = {line.split(" | ")[2]: line for line in table.splitlines() if line.startswith("| popqa |")}
    assert set(rows) == {"plain RAG", "fine-tuned RAG", "single-pass SFT"}
    assert "| 2 | 8/8 |" in rows["plain RAG"] and "| 2 | 0/8 |" in rows["fine-tuned RAG"]
    sft = rows["single-pass SFT"]
    assert "| 2 | 4/8 | -0.50 [" in sft and "+0.50 [" in sft  # vs plain RAG, vs fine-tuned RAG
    assert "| 50% |" in sft  # false abstains pooled over both seeds


def test_seeds_from_separate_outs_join_one_table_and_the_test_sets_aims_are_judged(tmp_path: Path) -> None:
    for seed, right in ((0, 1), (1, 3)):
        write_seed(tmp_path / f"out-{seed}", seed, right)
    table = transfer.table([tmp_path / "out-0", tmp_path / "out-1"])
    assert "seeds: 0, 1" in table
    sft = next(line for line in table.splitlines() if line.startswith("| popqa | test | single-pass SFT |"))
    assert "| 2 | 4/8 | -0.50 [" in sft
    aims = [line for line in table.splitlines() if line.startswith("- popqa, single-pass SFT:")]
    assert len(aims) == 1
    assert "missed: gold >= plain RAG (4 vs 8)" in aims[0] and "false abstains <= 25% (50%)" in aims[0]
    assert "met: gold >= fine-tuned RAG (4 vs 0)" in aims[0]
    (tmp_path / "out-1" / "seed-0").mkdir()
    with pytest.raises(SystemExit, match="seed-0 is in both"):
        transfer.table([tmp_path / "out-0", tmp_path / "out-1"])


def test_versus_pairs_two_recipes_on_the_seeds_both_hold(tmp_path: Path) -> None:
    for recipe, seeds, right in (("arm", (0, 1), 3), ("shipped", (0, 2), 1)):
        for seed in seeds:
            write_seed(tmp_path / f"{recipe}-{seed}", seed, right)
    text = transfer.versus([tmp_path / "arm-0", tmp_path / "arm-1"], [tmp_path / "shipped-0", tmp_path / "shipped-2"])
    assert text.startswith("seeds in both: 0")  # seed 1 (arm only) and seed 2 (shipped only) are left out
    sft = next(line for line in text.splitlines() if line.startswith("| popqa | single-pass SFT |"))
    assert sft == "| popqa | single-pass SFT | 1 | 3/4 | 1/4 | +0.50 [+0.00, +1.00] | 25% | 75% |"
    plain = next(line for line in text.splitlines() if line.startswith("| popqa | plain RAG |"))
    assert "| 4/4 | 4/4 | +0.00 [+0.00, +0.00] |" in plain


def test_unknown_sets_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["transfer.py", "--out", "x", "--sets", "nq"])
    with pytest.raises(SystemExit):
        transfer.main()


def test_an_rl_recipe_trains_on_the_seeds_records_and_is_calibrated_the_quickstarts_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(transfer, "selfrag", lambda *args: calls.append(args))
    recipe = Path(transfer.REPO) / "studies" / "transfer" / "rl-recipes" / "rl-sources.yaml"
    transfer.run_seed(tmp_path, 2, ["nq-open"], None, 5, False, rl_recipe=recipe)
    rl = next(call for call in calls if call[0] == "rl")
    seed_dir = tmp_path / "seed-2"
    assert rl[1:3] == ("--config", str(recipe))
    assert f"records={seed_dir / 'data' / 'records.jsonl'}" in rl
    assert {"training.max_steps=5", "training.seed=2", f"output_dir={seed_dir / 'rl'}"} <= set(rl)
    calibrate = calls[calls.index(rl) + 1]
    assert calibrate[0] == "calibrate" and f"data={seed_dir / 'splits' / 'dev.jsonl'}" in calibrate
    judged = [call for call in calls[calls.index(calibrate):] if call[0] == "eval"]
    assert [call for call in judged if f"model={seed_dir / 'rl'}" in call]
    calls.clear()
    transfer.run_seed(tmp_path, 2, ["nq-open"], None, 5, False)  # the CPU recipe: its own split, no records
    rl = next(call for call in calls if call[0] == "rl")
    assert rl[2] == str(transfer.RL_RECIPE) and not any(arg.startswith("records=") for arg in rl)


def test_the_rl_sources_recipe_names_files_that_exist() -> None:
    from selfrag.config import load_config
    from selfrag.rl.config import RLConfig

    repo = Path(transfer.REPO)
    config = load_config(RLConfig, repo / "studies" / "transfer" / "rl-recipes" / "rl-sources.yaml", [], model="m",
                         output_dir=str(repo / "unused"))
    assert config.per_source == 50 and config.reward.correctness == "f1"
    for path in [config.queries, *config.more_queries, *config.more_passages, config.retriever.corpus]:
        assert (repo / str(path)).is_file(), path


def test_a_runtime_variant_is_set_against_the_default_runtime_on_the_same_models(tmp_path: Path) -> None:
    """--runtime-name: the single-pass answers in ``sft@NAME`` paired with ``sft`` per seed and question; the
    baselines' rows are the same folders on both sides (a difference of exactly zero)."""
    questions = write_seeds(tmp_path, {0: 1, 1: 2})
    for seed, right in ((0, 1), (1, 2)):
        folder = tmp_path / f"seed-{seed}" / "evals" / "popqa"
        write_arm(folder / "sft@ret", "single_pass",
                  {q: ("Paris." if i < right + 1 else "The sources do not say.") for i, q in enumerate(questions)})
    table = transfer.versus([tmp_path], [tmp_path], "ret")
    rows = {line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| popqa |")}
    assert "seeds in both: 0, 1" in table
    assert "| 2 | 5/8 | 3/8 | +0.25 [" in rows["single-pass SFT"]  # one more answer in each seed
    assert "| 2 | 8/8 | 8/8 | +0.00 [+0.00, +0.00] |" in rows["plain RAG"]
    variant = transfer.table([tmp_path], "ret")  # the study's table with the variant's single-pass answers
    sft = next(line for line in variant.splitlines() if line.startswith("| popqa | test | single-pass SFT |"))
    assert "| 2 | 5/8 | -0.38 [" in sft
    with pytest.raises(SystemExit, match="holds none"):
        transfer.run_runtime(tmp_path, 0, ["popqa"], "ret", ["inference.weights.retrieval=0.5"])


def test_two_recipes_are_set_against_each_other_under_one_runtime_variant(tmp_path: Path) -> None:
    """--runtime-name with --versus: each side's ``sft@NAME`` answers, not the default runtime's ``sft``."""
    for recipe, right in (("arm", 3), ("shipped", 1)):
        questions = write_seeds(tmp_path / recipe, {0: 0})  # the default runtime's answers: none right
        write_arm(tmp_path / recipe / "seed-0" / "evals" / "popqa" / "sft@ret", "single_pass",
                  {q: ("Paris." if i < right else "The sources do not say.") for i, q in enumerate(questions)})
    text = transfer.versus([tmp_path / "arm"], [tmp_path / "shipped"], "ret", "ret")
    sft = next(line for line in text.splitlines() if line.startswith("| popqa | single-pass SFT |"))
    assert sft.startswith("| popqa | single-pass SFT | 1 | 3/4 | 1/4 | +0.50 [")
    default = transfer.versus([tmp_path / "arm"], [tmp_path / "shipped"])
    assert "| popqa | single-pass SFT | 1 | 0/4 | 0/4 |" in default
