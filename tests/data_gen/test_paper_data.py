"""The paper's released training data in and out: exact round trips, file:line refusals, and training on it.

tests/assets/paper_train_sample.jsonl is written by hand from the published field layout of selfrag_train_data
(instruction, input, output with reflection tokens and <paragraph>...</paragraph>, id, dataset_name), with the
forms the released data has: no retrieval, several retrievals, [Continue to Use Evidence], [Irrelevant] text with no
support verdict, text after a verdict without a retrieve token, and a non-empty input.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag import reflection as rf
from selfrag.app.cli import main
from selfrag.data_gen.paper_data import INPUT_MARK, export_file, import_file, read_examples, to_example, to_record
from selfrag.errors import InputError
from selfrag.training.dataset import read_records
from selfrag.trajectory import Record

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "tests" / "assets" / "paper_train_sample.jsonl"
CPU_RECIPE = REPO / "configs" / "train" / "smollm2-135m-cpu.yaml"


def sample() -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]


def records(path: Path) -> list[Record]:
    return [Record.from_json(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()]


def test_import_then_render_gives_the_same_text_and_export_the_same_lines(tmp_path: Path) -> None:
    report = import_file(SAMPLE, tmp_path / "records.jsonl")
    imported = records(tmp_path / "records.jsonl")
    examples = sample()
    assert report.records == len(imported) == len(examples)
    for record, example in zip(imported, examples, strict=True):
        assert record.render() == example["output"]
        assert record.source == example["dataset_name"] and record.id == f"paper/{example['id']}"
        expected = example["instruction"] + (INPUT_MARK + example["input"] if example["input"] else "")
        assert record.instruction == expected
    assert export_file(tmp_path / "records.jsonl", tmp_path / "paper.jsonl") == len(examples)
    assert (tmp_path / "paper.jsonl").read_text(encoding="utf-8") == SAMPLE.read_text(encoding="utf-8")
    assert report.loose == {"a passage without a support verdict": 1, "a segment without a retrieve token": 1}


def test_imported_segments_carry_the_papers_labels(tmp_path: Path) -> None:
    import_file(SAMPLE, tmp_path / "records.jsonl")
    by_id = {record.id: record for record in records(tmp_path / "records.jsonl")}
    rainbow = by_id["paper/asqa_118"]
    assert [s.retrieve.value for s in rainbow.segments if s.retrieve] == [
        rf.RETRIEVAL, rf.CONTINUE_EVIDENCE, rf.NO_RETRIEVAL,
    ]
    first = rainbow.segments[0]
    assert first.passage is not None and first.passage.title == "Rainbow" and first.passage.text.startswith("A rainbow")
    assert first.relevance is not None and first.relevance.value == rf.RELEVANT and first.relevance.labeler == "paper"
    assert rainbow.utility is not None and rainbow.utility.value == "[Utility:4]"
    irrelevant = by_id["paper/flan_v2_18700"].segments[0]
    assert irrelevant.relevance is not None and irrelevant.relevance.value == rf.IRRELEVANT
    assert irrelevant.support is None


def test_records_of_our_own_export_in_the_papers_form() -> None:
    example = sample()[1]
    record, _ = to_record(example, "x")
    own = Record(record.id, record.instruction, record.segments, record.utility, "squad_v2", {})
    assert to_example(own) == {
        "instruction": record.instruction,
        "input": "",
        "output": example["output"],
        "id": "x",
        "dataset_name": "squad_v2",
    }


BAD = [
    ('{"instruction": "Q?", "output": "[Retrieval]<paragraph>T\\nx[Relevant]A.[Utility:5]"}', "is never closed"),
    ('{"instruction": "Q?", "output": "[No Retrieval]A.[Utility:5] and more"}', "text after the utility token"),
    ('{"instruction": "Q?", "output": "[No Retrieval][Relevant]A.[Utility:5]"}', "relevance token without a passage"),
    ('{"instruction": "Q?"}', "field 'output' must be a non-empty string"),
    ('{"instruction": "Q?", "output": "[No Retrieval]A.[Utility:5]", "input": 3}', "field 'input' must be a string"),
    # a broken token was kept as answer text (issue 44)
    ('{"instruction": "Q?", "output": "[No Retrieval]Paris.[Utility:7]"}',
     "output holds '[Utility:7]' at character 21, which is not a reflection token — write the token exactly"),
    ('{"instruction": "Q?", "output": "[Retrieval]<paragraph>T\\nx</paragraph>[Relevant]A.[Fully Supported]'
     '[Utility:5]"}', "output holds '[Fully Supported]'"),
]


@pytest.mark.parametrize(("line", "what"), BAD)
def test_a_malformed_line_is_file_line_what_and_the_fix(tmp_path: Path, line: str, what: str) -> None:
    source = tmp_path / "paper.jsonl"
    source.write_text(SAMPLE.read_text(encoding="utf-8") + line + "\n", encoding="utf-8")
    with pytest.raises(InputError) as error:
        import_file(source, tmp_path / "records.jsonl")
    message = str(error.value)
    assert message.startswith(f"{source}:10: ") and what in message and " — " in message
    assert not (tmp_path / "records.jsonl").exists()


def test_a_json_array_file_reads_with_line_numbers(tmp_path: Path) -> None:
    source = tmp_path / "paper.json"
    source.write_text(json.dumps(sample(), indent=2), encoding="utf-8")
    lines = [line for line, _ in read_examples(source)]
    assert len(lines) == len(sample()) and lines[0] == 2 and lines == sorted(lines)
    report = import_file(source, tmp_path / "records.jsonl")
    assert report.records == len(sample())


def test_cli_import_and_a_hint_when_train_is_given_the_papers_file(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["paper-data", "import", str(SAMPLE), str(tmp_path / "records.jsonl")]) == 0
    assert "imported 9 records" in capsys.readouterr().out
    assert main(["paper-data", "import", str(SAMPLE), str(SAMPLE)]) == 2  # never over its own input
    with pytest.raises(InputError, match=r"paper_train_sample.jsonl:1: this is the paper's training-data form"):
        read_records(SAMPLE)


def test_selfrag_train_on_the_imported_sample_with_the_cpu_recipe(tmp_path: Path, tiny_base_dir: Path) -> None:
    """The CPU recipe's settings (tokens, LoRA, loss weights, question order, ranking term) on the tiny model."""
    import_file(SAMPLE, tmp_path / "records.jsonl")
    code = main(
        [
            "train", "--config", str(CPU_RECIPE), f"model={tiny_base_dir}", f"records={tmp_path / 'records.jsonl'}",
            f"output_dir={tmp_path / 'model'}", "training.max_steps=3", "training.save_steps=3",
            "training.eval_steps=0", "training.eval_fraction=0", "training.logging_steps=1", "training.max_length=512",
        ]
    )
    assert code == 0
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert len(metrics["train_losses"]) == 3 and all(entry["loss"] > 0 for entry in metrics["train_losses"])
    assert (tmp_path / "model" / "adapter_model.safetensors").is_file()
