"""Property: any keys and values on any command give exit 2 with one line per problem, or a valid config —
never a traceback, and never a model loaded before the config is accepted."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from selfrag.app.cli import main
from selfrag.data_gen.config import GenerateConfig
from selfrag.inference.config import InferenceConfig
from selfrag.rl.config import RLConfig
from selfrag.training.config import TrainConfig

COMMANDS = {
    "generate": GenerateConfig,
    "train": TrainConfig,
    "ask": InferenceConfig,
    "rl": RLConfig,
}


class Reached(BaseException):
    """The command got past its config into the stage's run(): the config was valid."""


def keys_of(cls: type, prefix: str = "") -> Iterator[str]:
    hints = typing.get_type_hints(cls)
    for spec in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[spec.name]):
            yield f"{prefix}{spec.name}"
            yield from keys_of(typing.cast(type, hints[spec.name]), f"{prefix}{spec.name}.")
        else:
            yield f"{prefix}{spec.name}"


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30) | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6,
)


def render(value: object) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("\n...\n").strip()


def overrides(cls: type) -> st.SearchStrategy[list[str]]:
    known = sorted(keys_of(cls)) + ["trl.bf16", "trl.warmup_steps", "peft.use_rslora", "trl.max_lenght", "lora.r.x"]
    key = st.sampled_from(known) | st.from_regex(r"[a-z_][a-z0-9_.]{0,10}", fullmatch=True) | st.text(max_size=8)
    tricky = [
        "nan",
        "inf",
        "-.inf",
        "~nouser/x",
        "a\x00b",
        "",
        " ",
        "[]",
        "{}",
        "null",
        "1e400",
        "0/1",
        "-1",
        "README.md",
    ]
    raw = st.text(max_size=16) | st.sampled_from(tricky)  # whatever a user types after '='
    value = VALUES.map(render) | raw
    pair = st.tuples(key, value).map(lambda kv: f"{kv[0]}={kv[1]}")
    return st.lists(pair | st.text(max_size=10), max_size=6)


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    import transformers

    import selfrag.models

    # Import every module that binds ``resolve_model`` by name first: one imported for the first time while the
    # patch is on would keep the patched function after this test (and break later tests that load models).
    for name in ("selfrag.evaluation.calibrate", "selfrag.evaluation.counting", "selfrag.evaluation.run",
                 "selfrag.training.run", "selfrag.training.export",
                 "selfrag.app.quickstart", "selfrag.inference.server.backend", "selfrag.inference.server.run",
                 "selfrag.loading", "selfrag.inference.engines.hf", "selfrag.data_gen.teachers"):
        importlib.import_module(name)

    def loaded(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded (or resolved) before the config was accepted")

    def reached(*args: object, **kwargs: object) -> None:
        raise Reached

    monkeypatch.setattr(selfrag.models, "resolve_model", loaded)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loaded)
    monkeypatch.setattr("selfrag.data_gen.run.run", reached)
    monkeypatch.setattr("selfrag.training.run.run", reached)
    monkeypatch.setattr("selfrag.rl.run.run", reached)
    monkeypatch.setattr("selfrag.inference.ask.ask", reached)


def check(command: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except Reached:
        return
    except SystemExit as stop:  # argparse: a usage mistake
        code = stop.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    lines = [line for line in err.splitlines() if " INFO " not in line]
    assert lines, (argv, err)
    assert "Traceback" not in err
    assert all(line.startswith(f"selfrag {command}: error: ") for line in lines), (argv, err)
    assert len(set(lines)) == len(lines), ("a problem printed twice", argv, err)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_random_overrides_never_give_a_traceback(
    command: str, capsys: pytest.CaptureFixture[str], no_model_loads: None, tmp_path: Path
) -> None:
    cls = COMMANDS[command]
    base = ["model=m", "retriever.corpus=c.jsonl", "Q?"] if command == "ask" else []

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(items=overrides(cls))
    def run(items: list[str]) -> None:
        check(command, [command, *base, *items], capsys)

    run()


def test_quickstart_random_overrides(capsys: pytest.CaptureFixture[str], no_model_loads: None, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from selfrag.app.quickstart import QuickstartConfig

    monkeypatch.chdir(tmp_path)  # a valid output_dir (nan, 0) is made relative to here: not in the checkout

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(items=overrides(QuickstartConfig))
    def run(items: list[str]) -> None:
        try:
            check("quickstart", ["quickstart", *items], capsys)
        except AssertionError as error:
            if "a model was loaded" in str(error):  # the quickstart's first step resolves the model: valid config
                return
            raise

    run()


def test_a_control_character_in_a_mapping_key_stays_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Found by the property test above: a ``\\r`` in a loss-weight key split the error line in two."""
    check("train", ["train", 'training.loss_weights={"\\r": null}', "model=m", "records=r.jsonl", "output_dir=o"],
          capsys)
