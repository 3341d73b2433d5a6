"""One retriever spelling, one runtime spelling and one CLI style in every command (issues 44, 54).

Every setting is ``key=value`` over an optional ``--config FILE``; the retriever is the ``retriever`` section, the
runtime's settings the ``inference`` section (ask, serve, eval, calibrate, quickstart). The options that once named a
setting (``ask --model/--corpus/--index``, ``serve --port`` ...), the top-level ``corpus=`` / ``index=`` keys, the
runtime's keys at the top level (``ask top_k=5``, ``eval engine=vllm``, ``serve engine_options.*``: each key under it)
and generate's ``corpus=`` and ``more_corpora=`` are refused in one line that names the new spelling, exit code 2,
before any work; so is a runtime key a command never took at its top level (``eval mode=always``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from selfrag.app.cli import main
from selfrag.data_gen import DEMO_CORPUS

REPO = Path(__file__).parents[2]

#: (command, option as typed, the line's fix): every option a command had (or a user carries over from another)
GONE = [
    ("ask", ["--model", "runs/model"], "--model is gone: write model=DIR"),
    ("ask", ["--corpus", "c.jsonl"], "--corpus is gone: write retriever.corpus=FILE"),
    ("ask", ["--index", "runs/index"], "--index is gone: write retriever.index=DIR (retriever.url=postgresql://"),
    ("ask", ["--index=runs/index"], "--index is gone: write retriever.index=DIR"),
    ("ask", ["--chunk-words", "80"], "--chunk-words is gone: write retriever.chunk_words=N"),
    ("ask", ["--chunk-overlap", "10"], "--chunk-overlap is gone: write retriever.chunk_overlap=N"),
    ("ask", ["--engine", "vllm"], "--engine is gone: write inference.engine=hf|vllm|openai"),
    ("serve", ["--model", "runs/model"], "--model is gone: write model=DIR"),
    ("serve", ["--corpus", "c.jsonl"], "--corpus is gone: write retriever.corpus=FILE"),
    ("serve", ["--index", "runs/index"], "--index is gone: write retriever.index=DIR"),
    ("serve", ["--engine", "openai"], "--engine is gone: write inference.engine=hf|vllm|openai"),
    ("serve", ["--host", "0.0.0.0"], "--host is gone: write host=ADDRESS"),
    ("serve", ["--port", "8080"], "--port is gone: write port=N"),
    ("eval", ["--model", "runs/model"], "--model is gone: write model=DIR"),
    ("eval", ["--corpus", "c.jsonl"], "--corpus is gone: write retriever.corpus=FILE"),
    ("eval", ["--index", "runs/index"], "--index is gone: write retriever.index=DIR"),
    ("calibrate", ["--model", "runs/model"], "--model is gone: write model=DIR"),
    ("calibrate", ["--corpus", "c.jsonl"], "--corpus is gone: write retriever.corpus=FILE"),
    ("rl", ["--model", "runs/model"], "--model is gone: write model=DIR"),
    ("rl", ["--index", "runs/index"], "--index is gone: write retriever.index=DIR"),
    ("train", ["--model", "smollm2-135m-instruct"], "--model is gone: write model=NAME"),
    ("quickstart", ["--model", "smollm2-135m-instruct"], "--model is gone: write model=NAME"),
]


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every stage's entry point replaced: a refused command must never reach one; an accepted one records its
    config here."""
    seen: dict[str, Any] = {}

    class Done:
        def summary(self) -> str:
            return "done"

    def stage(name: str) -> Any:
        def run(config: Any, *args: Any) -> Any:
            seen[name] = config
            return 0 if name == "serve" else Done()

        return run

    for name, target in [("serve", "selfrag.inference.server.run.run"), ("eval", "selfrag.evaluation.run.run"),
                         ("calibrate", "selfrag.evaluation.calibrate.run"), ("rl", "selfrag.rl.run.run"),
                         ("train", "selfrag.training.run.run"), ("quickstart", "selfrag.app.quickstart.run")]:
        monkeypatch.setattr(target, stage(name))

    def ask_many(config: Any, questions: list[str]) -> list[Any]:
        seen["ask"] = (config, questions)
        raise SystemExit(0)  # answering needs a model; what ask was given is what is checked

    monkeypatch.setattr("selfrag.inference.ask.ask_many", ask_many)
    return seen


def call(argv: list[str]) -> int:
    """``main``'s exit code, also where it exits by SystemExit (the stand-in ask, a usage error)."""
    try:
        return main(argv)
    except SystemExit as stop:
        return int(stop.code or 0)


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.strip() and " INFO " not in line]


@pytest.mark.parametrize(("command", "option", "fix"), GONE, ids=lambda value: " ".join(value) if isinstance(
    value, list) else str(value))
def test_an_old_option_is_refused_in_one_line_naming_the_key(
    command: str, option: list[str], fix: str, nothing_runs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    words = ["Who ruled Normandy?"] if command == "ask" else []
    with pytest.raises(SystemExit) as stop:
        main([command, *option, *words])
    assert stop.value.code == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"selfrag {command}: error: {fix}"), line
    assert not nothing_runs


def test_options_that_name_no_setting_stay(nothing_runs: dict[str, Any], tmp_path: Path) -> None:
    """--json, --questions, -q, --config are not settings: unchanged (and audit/pg keep their own --port)."""
    questions = tmp_path / "q.txt"
    questions.write_text("Who?\n")
    assert call(["ask", "--json", "model=m", f"retriever.corpus={DEMO_CORPUS}", "--questions", str(questions)]) == 0
    assert nothing_runs["ask"][1] == ["Who?"]
    assert call(["ask", "-q", "x=5: what is 2x?", "model=m", f"retriever.corpus={DEMO_CORPUS}"]) == 0
    assert nothing_runs["ask"][1] == ["x=5: what is 2x?"]


def _required(command: str, tmp_path: Path) -> list[str]:
    """Every required key of ``command`` but the retriever, so the retriever's line is the only one."""
    return {
        "ask": ["model=m", "Q?"],
        "serve": ["model=m"],
        "eval": ["model=m", "data=d.jsonl", f"output_dir={tmp_path / 'out'}"],
        "calibrate": ["model=m", "data=d.jsonl"],
        "rl": ["model=m", "queries=q.jsonl", f"output_dir={tmp_path / 'out'}"],
    }[command]


@pytest.mark.parametrize("command", ["ask", "serve", "eval", "calibrate", "rl"])
@pytest.mark.parametrize(("key", "fix"), [
    ("corpus=c.jsonl", "corpus was removed: write retriever.corpus=FILE"),
    ("index=runs/index", "index was removed: write retriever.index=DIR, or retriever.url=postgresql://"),
])
def test_a_top_level_retriever_key_is_refused_in_one_line(
    command: str, key: str, fix: str, nothing_runs: dict[str, Any], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert call([command, *_required(command, tmp_path), key]) == 2
    [line] = error_lines(capsys)  # not also "no passages": the removed key is the one mistake
    assert line.startswith(f"selfrag {command}: error: {fix}"), line
    assert not nothing_runs


@pytest.mark.parametrize("command", ["ask", "serve", "eval", "calibrate", "rl"])
def test_the_retriever_section_is_accepted_by_every_command(
    command: str, nothing_runs: dict[str, Any], tmp_path: Path
) -> None:
    index = tmp_path / "index"
    argv = [command, *_required(command, tmp_path), f"retriever.index={index}", "retriever.ef_search=50"]
    assert call(argv) == 2  # ef_search is pgvector's: every command checks the section alike
    url = "postgresql://u@db:5432/rag?table=wiki"
    assert call([command, *_required(command, tmp_path), f"retriever.url={url}", "retriever.mode=hybrid"]) == 0
    config = nothing_runs[command][0] if command == "ask" else nothing_runs[command]
    assert (config.model, config.retriever.url, config.retriever.mode) == ("m", url, "hybrid")


def test_ask_takes_its_question_positional_and_everything_else_as_keys(nothing_runs: dict[str, Any],
                                                                      tmp_path: Path) -> None:
    recipe = tmp_path / "ask.yaml"
    recipe.write_text(f"model: m\nretriever:\n  corpus: {tmp_path}\n  chunk_words: 80\ninference:\n  top_k: 2\n")
    code = call(["ask", "--config", str(recipe), "Who ruled Normandy?", "retriever.chunk_overlap=10",
                 "inference.mode=always"])
    assert code == 0
    config, questions = nothing_runs["ask"]
    assert questions == ["Who ruled Normandy?"]
    assert (config.model, config.retriever.corpus, config.retriever.chunk_words) == ("m", str(tmp_path), 80)
    assert (config.retriever.chunk_overlap, config.inference.mode, config.inference.top_k) == (10, "always", 2)


def test_serve_takes_every_setting_as_a_key(nothing_runs: dict[str, Any]) -> None:
    argv = ["serve", "--config", str(REPO / "configs/serve/default.yaml"), "model=m", "retriever.index=runs/index",
            "host=0.0.0.0", "port=8081", "inference.engine=openai",
            "inference.engine_options.base_url=http://127.0.0.1:9/v1"]
    assert main(argv) == 0
    config = nothing_runs["serve"]
    assert (config.model, config.retriever.index, config.host, config.port, config.inference.engine) == (
        "m", "runs/index", "0.0.0.0", 8081, "openai")
    assert config.inference.engine_options.base_url == "http://127.0.0.1:9/v1"


@pytest.mark.parametrize(("command", "recipe"), [("eval", "demo.yaml"), ("calibrate", "calibrate-demo.yaml")])
def test_eval_and_calibrate_recipes_name_their_corpus_in_the_section(
    command: str, recipe: str, nothing_runs: dict[str, Any], tmp_path: Path
) -> None:
    argv = [command, "--config", str(REPO / "configs/eval" / recipe), "model=m", f"output_dir={tmp_path / 'out'}"]
    if command == "calibrate":
        argv += ["data=d.jsonl", f"retriever.corpus={DEMO_CORPUS}"]
    assert main(argv) == 0
    assert Path(nothing_runs[command].retriever.corpus).resolve() == DEMO_CORPUS.resolve()
    # other data over the demo recipe: its corpus does not go with them; a prebuilt index of their own does
    if command == "eval":
        index = ["retriever.corpus=null", f"retriever.index={tmp_path / 'index'}"]
        assert main([*argv, "data=mine.jsonl", *index]) == 0
        assert nothing_runs["eval"].retriever.index == str(tmp_path / "index")


def test_rl_recipe_takes_the_section_from_the_command_line(nothing_runs: dict[str, Any], tmp_path: Path) -> None:
    argv = ["rl", "--config", str(REPO / "configs/rl/smollm2-135m-cpu.yaml"), "model=m",
            f"output_dir={tmp_path / 'out'}", "retriever.corpus=null", "retriever.index=runs/index"]
    assert main(argv) == 0
    assert (nothing_runs["rl"].retriever.index, nothing_runs["rl"].retriever.corpus) == ("runs/index", None)


@pytest.mark.parametrize(("key", "fix"), [
    ("reward.judge=nli", "reward.judge=nli is refused: the judge is a section, as in selfrag eval (kind, model, "
                         "threshold); write reward.judge.kind=nli"),
    ("reward.judge_model=runs/nli", "reward.judge_model was removed: write reward.judge.model=DIR"),
    ("reward.judge_threshold=0.7", "reward.judge_threshold was removed: write reward.judge.threshold="),
])
def test_rl_spells_its_claim_judge_as_eval_does(
    key: str, fix: str, nothing_runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The judge is a section in both commands (judge.kind / judge.model / judge.threshold); rl's flat keys are
    refused in one line naming it."""
    assert call(["rl", *_required("rl", tmp_path), "retriever.index=runs/index", key]) == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"selfrag rl: error: {fix}"), line
    assert not nothing_runs
    argv = ["rl", *_required("rl", tmp_path), "retriever.index=runs/index", "reward.judge.kind=nli",
            "reward.judge.model=runs/nli", "reward.judge.threshold=0.7"]
    assert call(argv) == 0
    judge = nothing_runs["rl"].reward.judge
    assert (judge.kind, judge.model, judge.threshold) == ("nli", "runs/nli", 0.7)


def test_rl_refuses_a_rollout_top_k_that_never_chose_anything(
    nothing_runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rollout puts one passage in a retrieval, the best not yet in context; top_k never changed which, and read
    like eval's passages per question: refused in one line saying so."""
    assert call(["rl", *_required("rl", tmp_path), "retriever.index=runs/index", "rollout.top_k=3"]) == 2
    [line] = error_lines(capsys)
    assert line.startswith("selfrag rl: error: rollout.top_k was removed: each [Retrieval] puts in one passage"), line
    assert line.endswith("delete rollout.top_k"), line
    assert not nothing_runs


# ---- the runtime's settings: one inference section (issue 54) ------------------------------------------------------

RUNTIME = ["inference.top_k=5", "inference.max_tokens=7", "inference.mode=always", "inference.on_unsupported=flag",
           "inference.engine=hf", "inference.engine_options.batch_size=3"]


@pytest.mark.parametrize("command", ["ask", "serve", "eval", "calibrate", "quickstart"])
def test_the_runtime_settings_are_one_inference_section_in_every_command(
    command: str, nothing_runs: dict[str, Any], tmp_path: Path
) -> None:
    required = [] if command == "quickstart" else [*_required(command, tmp_path), "retriever.index=runs/index"]
    assert call([command, *required, *RUNTIME]) == 0
    config = nothing_runs[command][0] if command == "ask" else nothing_runs[command]
    inference = config.inference
    assert (inference.top_k, inference.max_tokens, inference.mode, inference.on_unsupported) == (5, 7, "always", "flag")
    assert (inference.engine, inference.engine_options.batch_size) == ("hf", 3)


def _moved(key: str) -> str:
    """The refusal of a top-level runtime key, named in full (``engine_options.device=cuda``: the key under
    inference.engine_options, not the section)."""
    name = key.split("=")[0]
    return f"{name} was removed: write inference.{name} ("


#: (command, an old spelling, the start of its one-line refusal)
OLD_RUNTIME_KEYS = [
    *[("ask", key, _moved(key))
      for key in ("top_k=5", "max_tokens=8", "mode=always", "threshold=0.3", "on_unsupported=flag", "engine=vllm",
                  "engine_options.device=cuda", "weights.utility=0", "form=long")],
    *[(command, key, _moved(key)) for command in ("eval", "calibrate")
      for key in ("top_k=3", "max_tokens=96", "engine=vllm", "engine_options.device=cuda")],
    ("serve", "engine=openai", "engine was removed: write inference.engine"),
    ("serve", "engine_options.base_url=http://h:8000/v1",
     "engine_options.base_url was removed: write inference.engine_options.base_url ("),
    ("quickstart", "eval.engine_options.device=cuda",
     "eval.engine_options.device was removed: write inference.engine_options.device ("),
    ("quickstart", "eval.top_k=3", "eval.top_k was removed: write inference.top_k"),
    ("quickstart", "eval.engine=vllm", "eval.engine was removed: write inference.engine"),
    ("quickstart", "eval.inference.top_k=3", "eval.inference: the quickstart's inference section applies to "
                                            "calibration and evaluation alike; write inference.KEY=VALUE"),
]


def test_a_moved_section_is_refused_key_by_key(nothing_runs: dict[str, Any], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Each key under a moved section is named with its own new key, in one line each."""
    argv = ["eval", *_required("eval", tmp_path), "retriever.index=runs/index", "engine_options.device=cuda",
            "engine_options.vllm_args.kv_cache_dtype=fp8"]
    assert call(argv) == 2
    why = "(the runtime's settings are one inference section in every command)"
    assert error_lines(capsys) == [
        f"selfrag eval: error: engine_options.device was removed: write inference.engine_options.device {why}",
        "selfrag eval: error: engine_options.vllm_args.kv_cache_dtype was removed: write "
        f"inference.engine_options.vllm_args.kv_cache_dtype {why}",
    ]
    assert not nothing_runs


#: (command, a runtime key at the top level of a command that never took it there, the start of its line)
MISPLACED = [
    ("eval", "mode=always", "unknown config key 'mode': the runtime's mode is inference.mode (e.g. "
                            "inference.mode=always"),
    ("eval", "threshold=0.3", "unknown config key 'threshold': write inference.threshold (the runtime's settings "
                              "are the inference section in every command)"),
    ("eval", "pruning.margin=0.2", "unknown config key 'pruning.margin': write inference.pruning.margin ("),
    ("calibrate", "on_unsupported=flag", "unknown config key 'on_unsupported': write inference.on_unsupported ("),
    ("calibrate", "threshold=0.3", "unknown config key 'threshold': calibrate measures threshold"),
    ("quickstart", "eval.mode=always", "unknown config key 'eval.mode': the runtime's mode is inference.mode"),
    ("quickstart", "top_k=5", "unknown config key 'top_k': write inference.top_k ("),
    ("quickstart", "engine_options.device=cuda",
     "unknown config key 'engine_options.device': write inference.engine_options.device ("),
    ("serve", "top_k=5", "unknown config key 'top_k': write inference.top_k ("),
    ("serve", "mode=always", "unknown config key 'mode': write inference.mode ("),
]


@pytest.mark.parametrize(("command", "key", "fix"), OLD_RUNTIME_KEYS + MISPLACED, ids=lambda value: str(value)[:40])
def test_a_runtime_key_at_a_commands_top_level_is_refused_in_one_line_naming_the_inference_section(
    command: str, key: str, fix: str, nothing_runs: dict[str, Any], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A key the command took there once (removed) or never (misplaced) names its place under inference; eval's mode=
    is not modes=: the line says where the runtime's mode goes, and what modes= picks."""
    required = [] if command == "quickstart" else [*_required(command, tmp_path), "retriever.index=runs/index"]
    assert call([command, *required, key]) == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"selfrag {command}: error: {fix}"), line
    assert "did you mean" not in line
    if key.endswith("mode=always") and command in ("eval", "quickstart"):
        assert "modes=[...] picks the modes eval compares" in line
    assert not nothing_runs


@pytest.mark.parametrize(("command", "key", "line"), [
    ("ask", "inference.threshold=1.5", "inference.threshold must be in [0, 1], got 1.5; use inference.mode=always to "
                                       "always retrieve or inference.mode=never to never retrieve"),
    ("eval", "inference.top_k=0", "inference.top_k must be at least 1, got 0; use inference.mode=never to answer "
                                  "without passages"),
    ("quickstart", "inference.pruning.margin=2", "inference.pruning.margin must be in [0, 1], got 2.0; use "
                                                 "inference.pruning.enabled=false to turn it off"),
    ("generate", "teacher.engine_options.api_key_env=sk-123",
     "teacher.engine_options.api_key_env must be the NAME of an environment variable, got 'sk-123'; write e.g. "
     "teacher.engine_options.api_key_env=OPENAI_API_KEY"),
    ("serve", "inference.engine_options.api_key_env=sk-123",
     "inference.engine_options.api_key_env must be the NAME of an environment variable, got 'sk-123'; write e.g. "
     "inference.engine_options.api_key_env=OPENAI_API_KEY"),
])
def test_a_sections_hints_name_its_keys_as_the_user_writes_them(
    command: str, key: str, line: str, nothing_runs: dict[str, Any], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The fix a section's check suggests names the key with its section (inference.mode=always, not mode=always)."""
    required = {"quickstart": [], "generate": ["labeler=llm", "teacher.model=m", "passages=p.jsonl",
                                               f"output={tmp_path / 'out'}"]}.get(command)
    required = [*_required(command, tmp_path), "retriever.index=runs/index"] if required is None else required
    assert call([command, *required, key]) == 2
    [shown] = error_lines(capsys)
    assert shown.startswith(f"selfrag {command}: error: {line}"), shown
    assert not nothing_runs


def test_calibrate_refuses_the_values_it_measures(nothing_runs: dict[str, Any], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["calibrate", *_required("calibrate", tmp_path), "retriever.index=runs/index"]
    assert call([*argv, "inference.threshold=0.3", "inference.support_bound=0.2"]) == 2
    assert error_lines(capsys) == [
        "selfrag calibrate: error: inference.threshold=0.3: calibrate measures threshold (and writes it into the "
        "model's selfrag.json); leave it unset",
        "selfrag calibrate: error: inference.support_bound=0.2: calibrate measures support_bound (and writes it into "
        "the model's selfrag.json); leave it unset",
    ]
    assert not nothing_runs


@pytest.mark.parametrize(("command", "line"), [
    ("ask", "inference.top_k (int, 3): "), ("serve", "inference.top_k (int, 3): "),
    ("eval", "inference.top_k (int, 3): "), ("calibrate", "inference.top_k (int, 3): "),
    ("quickstart", "inference.max_tokens (int, 96): "),
])
def test_help_config_lists_the_runtime_under_inference(command: str, line: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert call([command, "--help-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(shown.startswith(line) for shown in lines), line
    assert any(shown.startswith("inference.engine_options.device (str, 'cpu'): ") for shown in lines)
    assert not [shown for shown in lines if shown.split(" ")[0] in ("top_k", "max_tokens", "engine", "mode")]
    # a line for each section, from its class's docstring, before its keys
    [section] = [number for number, shown in enumerate(lines) if shown.startswith("inference (section): ")]
    assert "How the runtime decides, ranks and answers" in lines[section], lines[section]
    assert lines[section + 1].startswith("inference.")
    assert any(shown.startswith("inference.engine_options (section): Options of the three backends (hf: ")
               for shown in lines)


def test_generate_names_the_data_sets_passages_passages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """generate's corpus= was the data set's passages (gold passages by id), beside retriever.corpus (what is
    searched): it is passages= now, and corpus= is refused in one line naming it."""
    assert call(["generate", "corpus=c.jsonl", "queries=q.jsonl", f"output={tmp_path / 'out'}"]) == 2
    [line] = error_lines(capsys)
    assert line.startswith("selfrag generate: error: corpus was removed: write passages=FILE"), line
    assert not (tmp_path / "out").exists()
    assert call(["generate", "passages=c.jsonl", "queries=q.jsonl", "more_corpora=[d.jsonl]",
                 f"output={tmp_path / 'out'}"]) == 2
    [line] = error_lines(capsys)
    assert line.startswith("selfrag generate: error: more_corpora was removed: write more_passages=[FILE, ...]"), line
    assert not (tmp_path / "out").exists()
    assert call(["generate", "--help-config"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert any(line.startswith("passages (") and "The data set's passages" in line for line in shown)
    assert any(line.startswith("more_passages (") for line in shown)
