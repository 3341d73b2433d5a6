"""YAML files + dotted ``key=value`` overrides -> typed, validated dataclasses.

    config = load_config(TrainConfig, "configs/train/smollm2-cpu.yaml", ["training.learning_rate=1e-3"])

Every problem is collected and reported together (unknown keys with a suggestion, wrong types,
missing required values, values a ``validate()`` method rejects), each naming the field, the value and
the fix. Config dataclasses document each field in ``field(metadata={"help": ...})``. A class may declare
``REMOVED_KEYS`` (a key it once had -> what to write instead), ``REFUSED_VALUES`` (field -> {a string value it
refuses -> what to write instead}) and ``MISPLACED_KEYS`` (a key it never had that belongs elsewhere -> where), so an
old or misplaced spelling fails in one line that names the new one; :func:`moved_keys` writes the entries of keys that
moved into a section (a section given under its old key is refused key by key, each naming its new key). A
``validate(prefix)`` is given the section's dotted path, so its hints name sibling keys as the user writes them.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import inspect
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from selfrag.errors import ConfigError, InputError
from selfrag.fsutil import read_text, write_text

T = TypeVar("T")
_MISSING = object()
_KEY_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_RST_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def help_field(
    help: str, default: Any = dataclasses.MISSING, default_factory: Any = dataclasses.MISSING, example: Any = None
) -> Any:
    """A dataclass field with its help text (shown by ``selfrag <command> --help-config``); ``example``: the value a
    type error suggests where the default shows none (an unset ``None``)."""
    metadata = {"help": help} if example is None else {"help": help, "example": example}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def redefault(cls: type, name: str, default: Any, example: Any = None) -> Any:
    """Field ``name`` of the dataclass ``cls``, declared again in a subclass with another ``default``: its help and
    metadata stay those of the one declaration (a section composed by a command that needs other defaults);
    ``example``: as :func:`help_field`'s, where the new default shows none (an empty string)."""
    spec = next(spec for spec in dataclasses.fields(cls) if spec.name == name)
    metadata = dict(spec.metadata) if example is None else {**spec.metadata, "example": example}
    return dataclasses.field(default=default, metadata=metadata)


def at_least_one(config: Any, names: Sequence[str], prefix: str = "") -> list[str]:
    """A problem for each integer field of ``config`` in ``names`` below 1 (``prefix``: its path in the config)."""
    return [f"{prefix}{name} must be at least 1, got {getattr(config, name)}" for name in names
            if getattr(config, name) < 1]


class MovedKey(str):
    """A ``REMOVED_KEYS`` (or ``MISPLACED_KEYS``) entry of a key whose place is ``key`` (``"write inference.top_k
    (why)"``): a mapping given under the old key (``engine_options.device=cuda``) is refused key by key, each naming
    its new key."""

    key: str
    why: str

    def __new__(cls, key: str, why: str) -> MovedKey:
        entry = super().__new__(cls, f"write {key} ({why})")
        entry.key, entry.why = key, why
        return entry

    def refusals(self, old: str, value: Any, line: str = "{key} was removed: {fix}") -> list[str]:
        """The refusal of ``value`` given under the old dotted key ``old``: one ``line``, or one per key of a
        mapping."""
        leaves = _leaf_keys(value) if isinstance(value, Mapping) else []
        if not leaves:
            return [line.format(key=old, fix=self)]
        return [line.format(key=f"{old}.{leaf}", fix=f"write {self.key}.{leaf} ({self.why})") for leaf in leaves]


def _leaf_keys(value: Mapping[str, Any]) -> list[str]:
    """The dotted keys of the leaves of a nested mapping (``{a: {b: 1}, c: 2}`` -> ``a.b``, ``c``)."""
    keys = []
    for key, child in value.items():
        below = _leaf_keys(child) if isinstance(child, Mapping) else []
        keys += [f"{_key_text(key)}.{leaf}" for leaf in below] if below else [_key_text(key)]
    return keys


def moved_keys(section: str, names: Sequence[str], why: str) -> dict[str, str]:
    """``REMOVED_KEYS`` entries for top-level keys that moved into ``section``, each naming its new key (``top_k``:
    "write inference.top_k (...)"; ``engine_options.device``: "write inference.engine_options.device (...)");
    ``why``: the reason, said in every entry."""
    return {name: MovedKey(f"{section}.{name}", why) for name in names}


def retry_problems(config: Any, prefix: str = "") -> list[str]:
    """A remote engine's retry settings (``timeout``, ``max_retries``, ``backoff``), each named with the fix."""
    problems = []
    if config.timeout <= 0:
        problems.append(f"{prefix}timeout must be > 0 seconds, got {config.timeout}; e.g. 60")
    if config.max_retries < 0:
        problems.append(f"{prefix}max_retries must be >= 0, got {config.max_retries}; 0 means no retry")
    if config.backoff < 0:
        problems.append(f"{prefix}backoff must be >= 0 seconds, got {config.backoff}; e.g. 1")
    return problems


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not found"
        raise ConfigError([f"config file {str(path)!r} {what}; pass an existing YAML file to --config"])
    try:
        text = read_text(path, "config file")
    except InputError as error:
        raise ConfigError([str(error)]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError([f"{where}: not valid YAML ({problem}); fix that line"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"config file {str(path)!r} must hold a mapping (key: value lines) at the top, got {type(data).__name__}"]
        )
    return data


def parse_override(override: str) -> tuple[list[str], Any] | str:
    """``"a.b=3"`` -> ``(["a", "b"], 3)``; a problem string when it is not ``key=value``."""
    key, sep, raw = override.partition("=")
    if not sep or not key:
        return f"override {_show(override)} is not key=value; write e.g. training.learning_rate=1e-3"
    parts = key.split(".")
    if not all(_KEY_PART.match(part) for part in parts):
        return f"override key {_show(key)} is not a dotted name like training.batch_size; write key=value"
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML: ``3``, ``true``, ``[a, b]``, ``null``)."""
    problems = []
    for override in overrides:
        parsed = parse_override(override)
        if isinstance(parsed, str):
            problems.append(parsed)
            continue
        parts, value = parsed
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
    if problems:
        raise ConfigError(problems)
    return data


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = (), **base: Any) -> T:
    """Load ``cls`` from an optional YAML file, then ``base`` keys, then overrides; validate everything."""
    problems: list[str] = []
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = read_yaml(path)
        except ConfigError as error:
            problems += error.problems
    data = deep_merge(data, base)
    try:
        data = apply_overrides(data, overrides)
    except ConfigError as error:
        problems += error.problems
    if problems:  # report the file and override problems together, before checking what they would build
        raise ConfigError(problems)
    return from_dict(cls, data)


def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    problems: list[str] = []
    result = _build(cls, data, "", problems)
    if problems:
        raise ConfigError(problems)
    return typing.cast(T, result)


def nested_problems(cls: type, data: Any, prefix: str, /, **base: Any) -> list[str]:
    """Problems of ``data`` read as ``cls`` keys under ``prefix`` (e.g. the quickstart's ``train`` dict), so a
    wrong nested value fails when the outer config loads; ``base`` fills the keys the outer command sets itself."""
    if not isinstance(data, Mapping):
        return [f"{prefix.rstrip('.')} must be a mapping of keys, got {_show(data)}; write {prefix}KEY=VALUE"]
    problems: list[str] = []
    _build(cls, deep_merge(dict(base), data), prefix, problems)
    return problems


def deep_merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` laid over it, mapping into mapping (the one deep merge: config layers, recipes)."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _show(value: Any, limit: int = 60) -> str:
    """A one-line, length-capped repr of a user's value for a message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "…" + text[-4:]


def _key_text(key: Any) -> str:
    """A user's mapping key as a message shows it: as typed where printable, else quoted (a ``\r`` in a key once
    split a one-line error in two)."""
    text = str(key)
    return text if text.isprintable() else repr(text)


def _build(
    cls: type[Any], data: Any, prefix: str, problems: list[str], partial: bool = False, replaced: set[str] | None = None
) -> Any:
    """``cls`` from ``data``, each problem appended to ``problems``; ``partial``: a stand-in section with each
    refused value replaced by its default (its dotted key added to ``replaced``)."""
    where = prefix.rstrip(".") or "config"
    if not isinstance(data, Mapping):
        problems.append(f"{where} must be a mapping of keys, got {_show(data)}; write {prefix}KEY=VALUE")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    removed: Mapping[str, str] = getattr(cls, "REMOVED_KEYS", {})  # a key that was a field once: what to do now
    # a value a field refuses with what to write instead: one it took once (a renamed value, a section that was a
    # flat value), or one a sibling command's field of the same name takes
    refused: Mapping[str, Mapping[str, str]] = getattr(cls, "REFUSED_VALUES", {})
    # a key it never had that a user may write for one elsewhere (eval's mode: inference.mode), said before a guess
    misplaced: Mapping[str, str] = getattr(cls, "MISPLACED_KEYS", {})
    gone = [line for key in data if key in removed for line in _removed(removed[key], f"{prefix}{key}", data[key])]
    problems += gone
    for key in data:
        if key in misplaced and key not in fields:
            problems += _removed(misplaced[key], f"{prefix}{key}", data[key], "unknown config key '{key}': {fix}")
        elif key not in fields and key not in removed:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(fields)}"
            problems.append(f"unknown config key {_show(f'{prefix}{key}')}{hint}")
    values: dict[str, Any] = {}
    bad: set[str] = set()
    stood_in: set[str] = set()  # keys in a section whose refused value its default stands in for (training.max_steps)
    for name, spec in fields.items():
        key = f"{prefix}{name}"
        found: list[str] = type(problems)()
        if name in data and isinstance(data[name], str) and data[name] in refused.get(name, {}):
            found.append(f"{key}={data[name]} is refused: {refused[name][data[name]]}")
        elif name in data:
            values[name] = _coerce(hints[name], data[name], key, found, example=_example(spec))
        elif dataclasses.is_dataclass(hints[name]) and spec.default is dataclasses.MISSING:
            values[name] = _build(typing.cast(type, hints[name]), {}, f"{key}.", found)
        elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            found.append(f"{key} is required; set it in the config file or pass {key}=...")
        if found:
            problems += found
            bad.add(name)
            if replaced is not None:
                replaced.add(key)
            values.pop(name, None)  # validate() below sees the default, never a value of the wrong type
            if dataclasses.is_dataclass(hints[name]) and isinstance(data.get(name), Mapping):
                # ... but of a section, only the bad keys: a wrong training.batch_size must not make validate()
                # see the recipe's training.max_steps as unset (its problems are reported above, not again)
                stand_in = _build(typing.cast(type, hints[name]), data[name], f"{key}.", [], True, stood_in)
                if stand_in is not None:
                    values[name] = stand_in
    if any(
        fields[name].default is dataclasses.MISSING and fields[name].default_factory is dataclasses.MISSING
        for name in bad
    ):
        return None
    try:
        instance = cls(**values)
    except (TypeError, ValueError) as error:
        problems.append(f"{where}: {error}")
        return None
    validate = getattr(instance, "validate", None)
    if callable(validate) and not gone:  # a removed key's value went nowhere: its consequence is not a 2nd problem
        try:
            if "prefix" in inspect.signature(validate).parameters:  # it names its keys (and its hints') in full
                found = list(validate(prefix=prefix))
            else:
                found = [f"{prefix}{problem}" for problem in validate()]
        except (TypeError, ValueError, ArithmeticError) as error:
            found = [f"{where}: a value is invalid ({error}); check the values against --help-config"]
        # A problem about a field already reported (its default stood in for the bad value) is not repeated, nor one
        # that names a key of a section whose default stood in: it is about the default, not what the user wrote
        problems += [problem for problem in found if problem[len(prefix) :].split(" ")[0].split(".")[0] not in bad
                     and not _names_any(problem, stood_in)]
    return None if bad and not partial else instance


def _removed(entry: str, old: str, value: Any, line: str = "{key} was removed: {fix}") -> list[str]:
    """The refusal (``line``) of a removed or misplaced key ``old`` given ``value`` (a section moved: one line per key
    under it)."""
    if isinstance(entry, MovedKey):
        return entry.refusals(old, value, line)
    return [line.format(key=old, fix=entry)]


def _names_any(problem: str, keys: set[str]) -> bool:
    """Whether ``problem`` names one of the dotted ``keys`` (as a whole key: not ``training.max_steps_x``)."""
    return any(re.search(rf"(?<![\w.]){re.escape(key)}(?!\w|\.\w)", problem) for key in keys)


def _example(spec: dataclasses.Field[Any]) -> str | None:
    default = spec.metadata.get("example", spec.default)
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, int | float | str | Path) and str(default) and "\n" not in str(default):
        return str(default) if not isinstance(default, str) or " " not in default else None
    return None


_TYPE_EXAMPLES = {int: "4", float: "0.5", bool: "true", str: "text", Path: "PATH"}


def _problem(key: str, expected: str, value: Any, hint: Any, example: str | None) -> str:
    sample = example if example is not None else _TYPE_EXAMPLES.get(hint)
    fix = f"; e.g. {key}={sample}" if sample is not None else ""
    return f"{key} must be {expected}, got {_show(value)}{fix}"


def _coerce(
    hint: Any, value: Any, key: str, problems: list[str], strict: bool = False, example: str | None = None
) -> Any:
    """``value`` checked (and converted where lossless) against the type ``hint``; problems go to ``problems``.

    ``strict`` (inside a union) refuses conversions, so ``str | list[str]`` given ``5`` is an error, not ``"5"``.
    """
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [arg for arg in get_args(hint) if arg is not type(None)]
        if value is None:
            if len(options) == len(get_args(hint)):
                problems.append(_problem(key, _type_name(hint), value, None, example))
            return None
        if len(options) == 1:
            return _coerce(options[0], value, key, problems, strict, example)
        for option in options:
            trial: list[str] = type(problems)()
            result = _coerce(option, value, key, trial, strict=True)
            if not trial:
                return result
        problems.append(_problem(key, _type_name(hint), value, None, example))
        return value
    if origin is Literal:
        choices = get_args(hint)
        if not any(value == choice and type(value) is type(choice) for choice in choices):
            problems.append(f"{key} must be one of {list(choices)}, got {_show(value)}")
        return value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        allowed = [member.value for member in hint]
        if value not in allowed and not isinstance(value, hint):
            problems.append(f"{key} must be one of {allowed}, got {_show(value)}")
        return value
    if dataclasses.is_dataclass(hint):
        cls = typing.cast(type, hint)
        if isinstance(value, cls) or (isinstance(problems, _Lenient) and isinstance(value, Mapping)):
            return value
        return _build(cls, value, f"{key}.", problems)
    if origin in (list, tuple, Sequence) or hint in (list, tuple):
        if not isinstance(value, list | tuple):
            problems.append(f"{key} must be a list, got {_show(value)}; write {key}=[a, b]")
            return value
        args = get_args(hint)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                problems.append(f"{key} must be a list of {len(args)} items, got {_show(value)}")
                return value
            pairs = enumerate(zip(args, value, strict=True))
            return [_coerce(arg, element, f"{key}[{i}]", problems, strict) for i, (arg, element) in pairs]
        item = args[0] if args else Any
        return [_coerce(item, element, f"{key}[{i}]", problems, strict) for i, element in enumerate(value)]
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if not isinstance(value, Mapping):
            problems.append(f"{key} must be a mapping, got {_show(value)}; write {key}.NAME=VALUE or {key}={{a: 1}}")
            return value
        args = get_args(hint)
        if args and args[1] is not Any:
            return {k: _coerce(args[1], v, f"{key}.{_key_text(k)}", problems, strict) for k, v in value.items()}
        return dict(value)
    if hint is Any or not isinstance(hint, type):
        return value
    return _coerce_scalar(hint, value, key, problems, strict, example)


def _coerce_scalar(hint: type, value: Any, key: str, problems: list[str], strict: bool, example: str | None) -> Any:
    if hint is bool:
        if not isinstance(value, bool):
            problems.append(_problem(key, "true or false", value, bool, example))
        return value
    if hint is int:
        if isinstance(value, float) and value.is_integer() and not strict:
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(_problem(key, "an integer", value, int, example))
        return value
    if hint is float:
        number = value
        if isinstance(value, str) and not strict:
            try:
                number = float(value)
            except ValueError:
                pass
        if isinstance(number, bool) or not isinstance(number, int | float):
            problems.append(_problem(key, "a number", value, float, example))
            return value
        if not math.isfinite(number):
            problems.append(_problem(key, "a finite number", value, float, example))
            return value
        return float(number)
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, Path):  # a field that takes a path or a URL (e.g. generate's output), set from code
            return str(value)
        if strict or isinstance(value, bool) or not isinstance(value, int | float):
            problems.append(_problem(key, "a string", value, str, example))
            return value
        return str(value)
    if hint is Path:
        if isinstance(value, Path) or (isinstance(value, str) and value.strip() and "\x00" not in value):
            try:
                return Path(value).expanduser()
            except RuntimeError:  # ~name of a user this machine does not know
                problems.append(f"{key}: cannot expand '~' in {_show(value)}; write the full path")
                return value
        problems.append(_problem(key, "a path", value, Path, example))
        return value
    if not isinstance(value, hint) and not isinstance(problems, _Lenient):
        problems.append(f"{key} must be a {hint.__name__}, got {_show(value)}")
    return value


def _type_name(hint: Any) -> str:
    names = []
    for arg in get_args(hint) or (hint,):
        if arg is type(None):
            names.append("null")
        elif get_origin(arg) is Literal:
            names.append(" or ".join(repr(choice) for choice in get_args(arg)))
        elif get_origin(arg) in (list, tuple, Sequence):
            names.append("a list")
        elif get_origin(arg) in (dict, Mapping):
            names.append("a mapping")
        else:
            names.append(
                {int: "an integer", float: "a number", str: "a string", bool: "true/false", Path: "a path"}.get(
                    arg, getattr(arg, "__name__", str(arg))
                )
            )
    return " or ".join(names)


class _Lenient(list[str]):
    """Problems of a pass-through option: a library's own classes (configs, enums) accept a mapping or string."""


def check_options(prefix: str, options: Mapping[str, Any], cls: type, owned: Mapping[str, str]) -> list[str]:
    """Problems with ``options`` passed through to the dataclass ``cls`` (``trl.SFTConfig``, ``peft.LoraConfig``).

    Each key must be an init field of ``cls`` that this recipe does not set itself (``owned`` maps those to
    the key to use instead), and each value must fit the field's type annotation, so a typo or a wrong type
    fails when the config loads, not after the model loads.
    """
    fields = {spec.name: spec for spec in dataclasses.fields(cls) if spec.init}
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an unresolvable annotation in a library: check the key only
        hints = {}
    problems: list[str] = []
    for key, value in options.items():
        name = f"{prefix}.{key}"
        if key in owned:
            problems.append(f"{name} is set by this recipe; set {owned[key]} instead")
        elif key not in fields:
            close = difflib.get_close_matches(str(key), sorted(fields), n=1)
            hint = f"; did you mean {prefix}.{close[0]}?" if close else f"; see the fields of {cls.__name__}"
            problems.append(f"unknown {prefix} option {_show(key)}{hint}")
        else:
            found = _Lenient()
            _coerce(hints.get(key, Any), value, name, found)
            problems += found
    return problems


def to_dict(config: Any) -> Any:
    """A config as plain YAML-able data (paths as strings)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, Path):
        return str(config)
    if isinstance(config, list | tuple):
        return [to_dict(item) for item in config]
    if isinstance(config, Mapping):
        return {str(k): to_dict(v) for k, v in config.items()}
    return config


def write_resolved(config: Any, directory: str | Path, name: str = "config.yaml") -> Path:
    """Write the fully resolved config into an output directory, so every run says how it was made."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    return write_text(path, yaml.safe_dump(to_dict(config), sort_keys=False, allow_unicode=True))


def describe(cls: type[Any], prefix: str = "") -> list[str]:
    """One line per field: ``key (type, default): help``, and one per section before its fields: ``key (section):
    what the section class is (its docstring's first paragraph) — what it is here (the field's help)``; for
    ``--help-config``."""
    lines = []
    hints = typing.get_type_hints(cls)
    for spec in dataclasses.fields(cls):
        hint = hints[spec.name]
        if dataclasses.is_dataclass(hint):
            about = [text for text in (section_help(typing.cast(type, hint)), spec.metadata.get("help", "")) if text]
            lines.append(f"{prefix}{spec.name} (section): {' — '.join(about)}")
            lines += describe(typing.cast(type, hint), f"{prefix}{spec.name}.")
            continue
        if spec.default is not dataclasses.MISSING:
            default = repr(spec.default)
        elif spec.default_factory is not dataclasses.MISSING:
            default = repr(spec.default_factory())
        else:
            default = "required"
        type_name = getattr(hint, "__name__", str(hint)).replace("typing.", "")
        lines.append(f"{prefix}{spec.name} ({type_name}, {default}): {spec.metadata.get('help', '')}")
    return lines


def section_help(cls: type) -> str:
    """The first paragraph of a section class's docstring, on one line ("" where it has none of its own)."""
    doc = cls.__dict__.get("__doc__") or ""
    if not doc or doc.startswith(f"{cls.__name__}("):  # the signature dataclasses writes where a class has no docstring
        return ""
    text = " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split())
    return _RST_ROLE.sub(r"\1", text).replace("``", "")  # :mod:`selfrag.x` -> selfrag.x, ``form=long`` -> form=long


def check_recipe_pairs(
    config_file: str | Path | None, overrides: Sequence[str], data_key: str = "data",
    corpus_key: str = "retriever.corpus",
) -> None:
    """A recipe's corpus (``corpus_key``, dotted) goes with its data: ``data_key=`` given on the command line over a
    recipe that names a corpus, without a corpus or retriever of its own, would search the recipe's corpus (the
    demo's) for the user's questions."""
    if config_file is None:
        return
    try:
        recipe = yaml.safe_load(Path(config_file).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return  # load_config reports an unreadable recipe
    corpus: Any = recipe
    for part in corpus_key.split("."):
        corpus = corpus.get(part) if isinstance(corpus, dict) else None
    given = {override.split("=", 1)[0].strip() for override in overrides}
    section = corpus_key.rpartition(".")[0]
    replaced = corpus_key in given or bool(section) and any(key.startswith(f"{section}.") for key in given)
    if corpus and data_key in given and not replaced:
        raise ConfigError([
            f"{data_key}= replaces the {data_key} of {config_file}, but its corpus ({corpus}) goes with that "
            f"{data_key}; pass {corpus_key}=YOUR_CORPUS too (or {corpus_key}=null where every line of your data has "
            "ctxs)"
        ])
