"""YAML files + dotted ``key=value`` overrides -> typed, validated dataclasses.

    config = load_config(TrainConfig, "configs/train/smollm2-cpu.yaml", ["training.learning_rate=1e-3"])

Every problem is collected and reported together (unknown keys with a suggestion, wrong types,
missing required values, values a ``validate()`` method rejects), each naming the field, the value and
the fix. Config dataclasses document each field in ``field(metadata={"help": ...})``.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from selfrag.errors import ConfigError

T = TypeVar("T")
_MISSING = object()


def help_field(help: str, default: Any = dataclasses.MISSING, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its help text (shown by ``selfrag <command> --help-config``)."""
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"config file {str(path)!r} not found; pass an existing YAML file to --config"])
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ConfigError([f"config file {str(path)!r} is not valid YAML: {error}".replace("\n", " ")]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"config file {str(path)!r} must hold a mapping at the top, got {type(data).__name__}"])
    return data


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML: ``3``, ``true``, ``[a, b]``, ``null``)."""
    problems = []
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key:
            problems.append(f"override {override!r} is not key=value; write e.g. training.learning_rate=1e-3")
            continue
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.split(".")
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
    data: dict[str, Any] = read_yaml(path) if path is not None else {}
    data = _deep_merge(data, base)
    data = apply_overrides(data, overrides)
    return from_dict(cls, data)


def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    problems: list[str] = []
    result = _build(cls, data, "", problems)
    if problems:
        raise ConfigError(problems)
    return typing.cast(T, result)


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _build(cls: type[Any], data: Any, prefix: str, problems: list[str]) -> Any:
    where = prefix.rstrip(".") or "config"
    if not isinstance(data, Mapping):
        problems.append(f"{where} must be a mapping of keys, got {data!r}")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(fields)}"
            problems.append(f"unknown config key '{prefix}{key}'{hint}")
    values: dict[str, Any] = {}
    missing = False
    for name, spec in fields.items():
        key = f"{prefix}{name}"
        if name in data:
            values[name] = _coerce(hints[name], data[name], key, problems)
        elif dataclasses.is_dataclass(hints[name]) and spec.default is dataclasses.MISSING:
            values[name] = _build(typing.cast(type, hints[name]), {}, f"{key}.", problems)
        elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            problems.append(f"{key} is required; set it in the config file or pass {key}=...")
            missing = True
    if missing:
        return None
    try:
        instance = cls(**values)
    except (TypeError, ValueError) as error:
        problems.append(f"{where}: {error}")
        return None
    validate = getattr(instance, "validate", None)
    if callable(validate):
        problems.extend(f"{prefix}{problem}" for problem in validate())
    return instance


def _coerce(hint: Any, value: Any, key: str, problems: list[str]) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [arg for arg in get_args(hint) if arg is not type(None)]
        if value is None:
            return None
        if len(options) == 1:
            return _coerce(options[0], value, key, problems)
        for option in options:
            trial: list[str] = []
            result = _coerce(option, value, key, trial)
            if not trial:
                return result
        problems.append(f"{key} must be one of {options}, got {value!r}")
        return value
    if origin is Literal:
        choices = get_args(hint)
        if value not in choices:
            problems.append(f"{key} must be one of {list(choices)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(hint):
        return _build(typing.cast(type, hint), value, f"{key}.", problems)
    if origin in (list, tuple, Sequence):
        if not isinstance(value, list | tuple):
            problems.append(f"{key} must be a list, got {value!r}; write {key}=[a, b]")
            return value
        (item,) = get_args(hint)[:1] or (Any,)
        return [_coerce(item, element, f"{key}[{i}]", problems) for i, element in enumerate(value)]
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            problems.append(f"{key} must be a mapping, got {value!r}")
            return value
        return dict(value)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            problems.append(f"{key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{key} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems.append(f"{key} must be a number, got {value!r}")
            return value
        return float(value)
    if hint is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            problems.append(f"{key} must be a string, got {value!r}")
            return value
        return str(value)
    if hint is Path:
        if not isinstance(value, str | Path):
            problems.append(f"{key} must be a path, got {value!r}")
            return value
        return Path(value).expanduser()
    return value


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
    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False), encoding="utf-8")
    return path


def describe(cls: type[Any], prefix: str = "") -> list[str]:
    """One line per field: ``key (type, default): help`` — for ``--help-config``."""
    lines = []
    hints = typing.get_type_hints(cls)
    for spec in dataclasses.fields(cls):
        hint = hints[spec.name]
        if dataclasses.is_dataclass(hint):
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
