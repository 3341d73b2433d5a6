"""Honest reruns: what a stage's output directory was made from, and refusing to mix two different runs.

    fingerprint = run_fingerprint("train", settings=to_dict(config), inputs={"records": config.records},
                                  ignore=("output_dir", "restart"))
    state = check_rerun(config.output_dir, fingerprint, restart=config.restart)   # "fresh" or "resume"

A stage writes ``run.json`` (its settings and the SHA-256 of each input file's content) into its output
directory before it starts. A later run into the same directory:

* with the same fingerprint resumes (a training run continues from its last checkpoint);
* with different settings or different input content is refused with a message listing exactly what
  differs, unless ``restart=true``, which deletes the old run's outputs and starts over;
* over a previous run that stopped before writing anything but ``run.json`` starts over quietly;
* into a non-empty directory that holds no ``run.json`` is refused: it is not a selfrag run of this stage, and
  nothing in it is deleted, even with ``restart=true``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from selfrag.errors import SelfragError

logger = logging.getLogger(__name__)

RUN_FILE = "run.json"
RUN_VERSION = 1
_CHUNK = 1 << 20


class RunMismatchError(SelfragError, ValueError):
    """An output directory holds a different run; the message lists the differences and the fix."""


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (streamed), as ``sha256:<hex>``."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def run_fingerprint(
    stage: str, settings: Mapping[str, Any], inputs: Mapping[str, str | Path], ignore: Iterable[str] = ()
) -> dict[str, Any]:
    """What makes a run what it is: the stage, its settings (minus ``ignore``d dotted keys) and its inputs' hashes.

    ``settings`` is a nested dict (e.g. ``selfrag.config.to_dict(config)``); input files are hashed by content,
    so a moved or renamed file with the same bytes is the same run, and an edited file in place is not.
    """
    flat = {key: value for key, value in _flatten(settings).items() if not _ignored(key, ignore)}
    hashes = {name: file_digest(path) for name, path in inputs.items()}
    return {"version": RUN_VERSION, "stage": stage, "settings": flat, "inputs": hashes}


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Human-readable differences between two fingerprints, e.g. ``training.learning_rate: 0.001 -> 0.01``."""
    lines = []
    if old.get("stage") != new.get("stage"):
        lines.append(f"stage: {old.get('stage')!r} -> {new.get('stage')!r}")
    old_inputs, new_inputs = old.get("inputs", {}), new.get("inputs", {})
    for name in sorted(set(old_inputs) | set(new_inputs)):
        before, after = old_inputs.get(name), new_inputs.get(name)
        if before != after:
            lines.append(f"{name}: content differs ({_short(before)} -> {_short(after)})")
    old_settings, new_settings = old.get("settings", {}), new.get("settings", {})
    for key in sorted(set(old_settings) | set(new_settings)):
        before, after = old_settings.get(key, "<unset>"), new_settings.get(key, "<unset>")
        if before != after:
            lines.append(f"{key}: {json.dumps(before, default=str)} -> {json.dumps(after, default=str)}")
    return lines


def check_rerun(
    output_dir: str | Path, fingerprint: Mapping[str, Any], restart: bool, key: str = "restart"
) -> Literal["fresh", "resume"]:
    """Decide whether ``output_dir`` starts fresh or resumes; refuse a different run; write ``run.json``.

    ``key`` is the config key that says "start over", named in the refusal message.
    """
    output_dir = Path(output_dir)
    previous = read_fingerprint(output_dir)
    if previous is None:
        if output_dir.is_dir() and any(output_dir.iterdir()):
            raise RunMismatchError(
                f"output_dir {str(output_dir)!r} is not empty and holds no {RUN_FILE} (it is not a selfrag "
                f"{fingerprint['stage']} run, or one from an older version); choose an empty or new output_dir"
            )
        _write(output_dir, fingerprint)
        return "fresh"
    changed = differences(previous, fingerprint)
    if changed and [entry.name for entry in output_dir.iterdir()] == [RUN_FILE]:
        # The previous run stopped before it wrote anything (a wrong model name, a bad record): nothing to lose.
        logger.info("%s holds only the run.json of a run that produced nothing; starting over", output_dir)
        _write(output_dir, fingerprint)
        return "fresh"
    if not changed:
        logger.info("%s holds a run with the same settings and inputs; resuming it", output_dir)
        return "resume"
    listing = "\n  - ".join(changed)
    if not restart:
        raise RunMismatchError(
            f"output_dir {str(output_dir)!r} holds a different {previous.get('stage')} run:\n  - {listing}\n"
            f"set {key}=true to delete it and start over, or choose another output_dir"
        )
    logger.warning("%s=true: deleting the previous run in %s, which differed:\n  - %s", key, output_dir, listing)
    _clear(output_dir)
    _write(output_dir, fingerprint)
    return "fresh"


def read_fingerprint(output_dir: str | Path) -> dict[str, Any] | None:
    """The ``run.json`` of ``output_dir``, or None where there is none."""
    path = Path(output_dir) / RUN_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise RunMismatchError(f"{path} is malformed ({error}); delete it or choose another output_dir") from None
    if not isinstance(data, dict):
        raise RunMismatchError(f"{path} is malformed (not an object); delete it or choose another output_dir")
    return data


def _write(output_dir: Path, fingerprint: Mapping[str, Any]) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    temporary = output_dir / f".{RUN_FILE}.tmp"
    temporary.write_text(json.dumps(fingerprint, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    temporary.replace(output_dir / RUN_FILE)


def _clear(output_dir: Path) -> None:
    """Delete everything in a directory known (by its run.json) to be a selfrag run's output."""
    for entry in output_dir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _flatten(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = str(value) if isinstance(value, Path) else value
    return flat


def _ignored(key: str, ignore: Iterable[str]) -> bool:
    return any(key == prefix or key.startswith(f"{prefix}.") for prefix in ignore)


def _short(digest: str | None) -> str:
    if digest is None:
        return "none"
    return digest.split(":", 1)[-1][:12]
