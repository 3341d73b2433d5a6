"""docs/own-data.md ("Bring your own data") walked end to end: every `selfrag` command of its `bash` blocks, run with
the real CLI entry point on the page's worked example (tests/assets/own_data: 30 passages on three invented topics,
15 questions with gold passage ids and train/dev/test splits), so the path a user takes with their own data cannot
rot. Where the page names a model, the tests' tiny model stands in; the only other changes are speed settings
(steps, max_tokens, the judge), listed in EXTRA."""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import pytest

from selfrag.app.cli import main
from selfrag.passages import PassageStore

REPO = Path(__file__).parents[2]
PAGE = REPO / "docs" / "own-data.md"
ASSETS = REPO / "tests" / "assets" / "own_data"
#: speed settings per command (the page's own settings are kept; these are appended)
EXTRA = {
    "ask": ["inference.max_tokens=8"],
    "train": ["training.max_steps=2", "training.batch_size=2", "training.max_length=512", "training.save_steps=1"],
    "calibrate": ["inference.max_tokens=8"],
    "eval": ["inference.max_tokens=8", "judge.kind=overlap", "plots=false"],
}


def page_commands() -> list[list[str]]:
    """The `selfrag ...` lines of the page's ```bash blocks, split like a shell would (without `selfrag`)."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    lines = [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("selfrag ")]


def _path(value: str, runs: Path, model: Path) -> str:
    """A path of the page, on this machine: my-data/ is the example, runs/ a temporary folder."""
    for prefix, target in (("my-data/", f"{ASSETS}/"), ("runs/", f"{runs}/"), ("selfrag-quickstart/model", str(model))):
        if value.startswith(prefix):
            return target + value[len(prefix):]
    return value


def localised(argv: list[str], runs: Path, model: Path, base: Path) -> list[str]:
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        out.append(f"{key}={_path(value, runs, model)}" if sep and not arg.startswith("-") else _path(arg, runs, model))
    extra = list(EXTRA.get(argv[0], []))
    if argv[0] == "train":
        extra.append(f"model={base}")  # the recipe's SmolLM2, replaced by the tiny base model
    return out + extra


@pytest.fixture(scope="module")
def any_selfrag_model(tmp_path_factory, tiny_tokenizer, tiny_model_builder) -> Path:  # type: ignore[no-untyped-def]
    """Stands in for the quickstart's model: a tiny model with the reflection tokens and its selfrag.json."""
    from selfrag.artifacts import ModelMeta, save_meta
    from selfrag.reflection import TOKENS, reflection_ids

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.add_tokens(list(TOKENS), special_tokens=True)
    path = tmp_path_factory.mktemp("any-model")
    tiny_model_builder(len(tokenizer), seed=3).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    save_meta(path, ModelMeta(reflection_ids(tokenizer), "add", "auto", "tiny-base", "merged"))
    return path


def _rows(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _index_passages(index: Path) -> list[dict]:  # type: ignore[type-arg]
    store = PassageStore(index / "passages.sqlite")
    return [passage.to_json() for passage in store.by_rows(range(len(store)))]


def test_the_page_walks_end_to_end(any_selfrag_model: Path, tiny_base_dir: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    commands = page_commands()
    assert [argv[0] for argv in commands] == ["index", "index", "ask", "ask", "generate", "train", "calibrate",
                                              "eval", "ask"]
    assert "selfrag serve model=runs/my-model retriever.index=runs/my-index" in PAGE.read_text(encoding="utf-8")
    monkeypatch.chdir(REPO)  # the page's configs/ paths are relative to the repository root
    runs = tmp_path / "runs"
    printed: dict[int, str] = {}
    for number, argv in enumerate(commands):
        code = main(localised(argv, runs, any_selfrag_model, tiny_base_dir))
        captured = capsys.readouterr()
        assert code == 0, f"`selfrag {shlex.join(argv)}` exited {code}: {captured.err[-2000:]}"
        printed[number] = captured.out

    # index: 30 JSONL passages; the Markdown folder in 60-word chunks titled by its headings, no '#' in the text
    assert len(_index_passages(runs / "my-index")) == 30
    chunks = _index_passages(runs / "my-docs-index")
    assert len(chunks) > 3 and not any("#" in chunk["text"] for chunk in chunks)
    assert {chunk["title"].split(" — ")[0] for chunk in chunks} == {"Velm harbour", "Quill language", "Orrin beetle"}
    assert any(" — " in chunk["title"] for chunk in chunks)
    # ask: plain output with the decisions, and --json with the trace
    assert "decisions:" in printed[2]
    assert json.loads(printed[3])["trace"][0]["step"] == "decide"
    # generate: records of the 9 train questions only (dev and test questions are never trained on)
    questions = _rows(ASSETS / "questions.jsonl")
    train = {q["id"] for q in questions if q["meta"]["split"] == "train"}
    records = _rows(runs / "my-data" / "records.jsonl")
    assert {r["meta"]["query_id"] for r in records} == train
    assert {r["meta"]["kind"] for r in records} >= {"gold", "hard", "support-negative"}
    # train, then calibrate on the 3 dev questions: the values land in the model's selfrag.json
    calibration = json.loads((runs / "my-model" / "selfrag.json").read_text(encoding="utf-8"))["calibration"]
    assert calibration["dev_examples"] == 3
    # eval on the 3 test questions: three modes, prompted only when listed
    results = json.loads((runs / "my-eval" / "results.json").read_text(encoding="utf-8"))
    assert set(results["modes"]) == {"no_retrieval", "plain_rag", "single_pass"}
    assert all(summary["examples"] == 3 for summary in results["modes"].values())
    assert "decisions:" in printed[8]
