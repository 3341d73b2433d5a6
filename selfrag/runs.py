"""Honest reruns, one mechanism for every stage: what an output was made from, and what a rerun does with it.

    fingerprint = run_fingerprint("train", to_dict(config), {"records": config.records}, root=config.output_dir,
                                  ignore=("output_dir", "restart"))
    state = check_rerun(config.output_dir, fingerprint, restart=config.restart)   # "fresh" or "resume"

    ledger = Ledger(output / "stages.json")             # named pieces of work, each redone when its fingerprint changes
    verdict = ledger.check("train", fingerprint)        # verdict.state: "new" | "same" | "changed"; verdict.changes

A fingerprint is the stage, its settings (flattened to dotted keys) and the SHA-256 of each input's content:

* an input is compared by content, never by where it is: a moved or renamed file with the same bytes is the same
  run, an edited file in place is not (its path setting is left out of the settings);
* a path inside the output folder is written relative to it (``$OUTPUT/data/records.jsonl``), so a folder copied
  or moved elsewhere resumes instead of recomputing;
* a setting the older run did not record (one added to the toolkit since) counts as its default, given in
  ``defaults``; one it recorded under a key since renamed or removed is read as ``renamed`` says (a config's
  ``RENAMED_SETTINGS``: :func:`setting_renames`); an input it did not record is not compared.

Three things a stage does with it, all here:

* :func:`check_rerun` (train, generate): one fingerprint file per output folder. The same fingerprint resumes; a
  different one is refused with one line naming each changed setting or input and the fix; ``restart`` deletes the
  old outputs and starts over, same fingerprint or not; a folder holding nothing but bookkeeping (or empty files)
  starts over quietly; a non-empty folder with no fingerprint, or one an older version wrote (another
  ``version``), is refused in one line (``restart`` starts over), and nothing in it is deleted.
* :class:`Ledger` (quickstart stages, eval modes): named entries, each with its fingerprint and whether it
  finished; a changed entry (or one an older version wrote) is redone (the caller clears its outputs), an unchanged
  finished one is kept.
* per-item resume (generate's questions, eval's answers) keys each item by :func:`content_digest` of what made it.

Nothing an older version wrote in another format is read as work: it is refused, or redone, never reused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from selfrag.config import to_dict
from selfrag.errors import ConfigError
from selfrag.fsutil import OWNER_FILE, file_digest, write_json

logger = logging.getLogger(__name__)

RUN_FILE = "run.json"
RUN_VERSION = 2
#: How a path inside the output folder is written in a fingerprint.
OUTPUT = "$OUTPUT"
#: Files larger than this are identified by size and modification time, not read (a model's weight shards).
LARGE_FILE = 256 << 20


class RunMismatchError(ConfigError):
    """An output directory holds a different run; the one-line message names the differences and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__([message])


# ---- digests -------------------------------------------------------------------------------------------------


def bytes_digest(data: bytes) -> str:
    """SHA-256 of bytes in memory, as ``sha256:<hex>`` (a shard's or a pushed part's contents)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def text_key(text: str, length: int | None = None) -> str:
    """The bare hex SHA-256 of ``text`` (UTF-8), its first ``length`` digits where given: the one hash behind every
    cache key, file name and prompt version the project stores without the ``sha256:`` prefix."""
    hexdigest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return hexdigest if length is None else hexdigest[:length]


def content_digest(data: Any) -> str:
    """SHA-256 of JSON-able data (keys sorted), as ``sha256:<hex>``: a corpus as read, one question, a fingerprint."""
    payload = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
    return "sha256:" + hashlib.sha256(payload.encode("utf-8")).hexdigest()


def directory_digest(path: str | Path, skip: Iterable[str] = ()) -> str:
    """A directory by its files' relative names and contents (``skip``: top-level entries left out).

    Files over :data:`LARGE_FILE` (weight shards of a 7-8B model) count by size and modification time: reading
    them would take minutes, and a retrained or re-exported model rewrites them. A copy that keeps times
    (``cp -a``, ``shutil.copytree``) is the same directory; a small model or adapter is the same after any copy.
    """
    root = Path(path)
    skipped = set(skip)
    digest = hashlib.sha256()
    for file in sorted(root.rglob("*")):
        relative = file.relative_to(root)
        if not file.is_file() or relative.parts[0] in skipped:
            continue
        stat = file.stat()
        identity = f"{stat.st_size}:{stat.st_mtime_ns}" if stat.st_size > LARGE_FILE else file_digest(file)
        digest.update(f"{relative.as_posix()}\0{identity}\n".encode())
    return f"sha256:{digest.hexdigest()}"


# ---- fingerprints --------------------------------------------------------------------------------------------


def run_fingerprint(
    stage: str,
    settings: Mapping[str, Any],
    inputs: Mapping[str, str | Path | None] = {},  # noqa: B006 (read only)
    ignore: Iterable[str] = (),
    *,
    root: str | Path | None = None,
    keep: Iterable[str] | None = None,
    digests: Mapping[str, str | None] = {},  # noqa: B006 (read only)
) -> dict[str, Any]:
    """What makes a run what it is: the stage, its settings and its inputs' content digests.

    ``settings``: nested (``selfrag.config.to_dict(config)``), flattened to dotted keys; ``keep`` (dotted keys or
    prefixes) selects the ones that change the output, ``ignore`` drops some. ``inputs``: files hashed by content
    (their same-named settings are dropped); ``digests``: inputs already digested (a corpus as read, an upstream
    stage). ``root``: the output folder, paths inside it are written relative to it.
    """
    flat = _flatten(settings)
    # where each input was read (a file input's path, a digested input's same-named setting): named in messages,
    # never compared, so a moved file with the same bytes stays the same run
    sources = {name: portable(str(path), root) for name, path in inputs.items() if path is not None}
    sources.update({name: portable(flat[name], root) for name in digests
                    if flat.get(name) and isinstance(flat[name], str)})
    if keep is not None:
        kept = tuple(keep)
        flat = {key: value for key, value in flat.items() if _under(key, kept)}
    dropped = (*ignore, *inputs, *digests)
    flat = {key: portable(value, root) for key, value in flat.items() if not _under(key, dropped)}
    hashes: dict[str, str | None] = {
        name: None if path is None else file_digest(path) for name, path in inputs.items()
    }
    hashes.update(digests)
    fingerprint = {"version": RUN_VERSION, "stage": stage, "settings": flat, "inputs": hashes}
    return fingerprint | ({"sources": sources} if sources else {})


def portable(value: Any, root: str | Path | None) -> Any:
    """``value`` with a path inside ``root`` written as ``$OUTPUT/relative``; anything else unchanged."""
    if root is None or not isinstance(value, str | Path) or (isinstance(value, str) and "/" not in value):
        return str(value) if isinstance(value, Path) else value
    try:
        relative = Path(value).expanduser().resolve().relative_to(Path(root).expanduser().resolve())
    except (ValueError, OSError):
        return str(value)
    return OUTPUT if relative == Path(".") else f"{OUTPUT}/{relative.as_posix()}"


def fingerprint_digest(fingerprint: Mapping[str, Any]) -> str:
    """A short stable name of a fingerprint, for chaining stages (a later stage's input) and for logs; where the
    inputs were read (``sources``) is not part of it."""
    return content_digest({key: value for key, value in fingerprint.items() if key != "sources"}).split(":", 1)[1][:16]


def differences(
    old: Mapping[str, Any], new: Mapping[str, Any], defaults: Mapping[str, Any] = {},  # noqa: B006 (read only)
    renamed: Mapping[str, str | None] = {},  # noqa: B006 (read only)
) -> list[str]:
    """Each difference as a fix-shaped phrase: ``training.learning_rate=0.02 (was 0.01)``, ``records: content changed
    (3f2a91c0e1b2 -> 77b0e1d4aa90) in data/r.jsonl`` (the path, where the new fingerprint knows it). A setting
    ``old`` lacks counts as ``defaults[key]``; inputs are compared where both recorded them. ``renamed``: a setting
    ``old`` may spell as it once was -> its key now (None: a setting that is gone, not compared), so a run made
    before a key was renamed resumes (a config's ``RENAMED_SETTINGS``); a key ending in ``.`` renames every key under
    it (``engine_options.`` -> ``inference.engine_options.``); an input named as a renamed setting is renamed alike."""
    lines = []
    if old.get("stage") != new.get("stage"):
        lines.append(f"stage={new.get('stage')!r} (was {old.get('stage')!r})")
    old_inputs, new_inputs = _renamed(old.get("inputs") or {}, renamed), new.get("inputs") or {}
    sources = new.get("sources") or {}
    for name in sorted(set(old_inputs) & set(new_inputs)):
        before, after = old_inputs[name], new_inputs[name]
        if before != after:
            where = f" in {sources[name]}" if name in sources else ""
            lines.append(f"{name}: content changed ({_short(before)} -> {_short(after)}){where}")
    old_settings, new_settings = old.get("settings") or {}, new.get("settings") or {}
    old_settings = _renamed(old_settings, renamed)
    missing = object()
    for key in sorted(set(old_settings) | set(new_settings)):
        before = old_settings.get(key, defaults.get(key, missing))
        after = new_settings.get(key, missing)
        if before != after:
            lines.append(f"{key}={_show(after, missing)} (was {_show(before, missing)})")
    return lines


def _renamed(recorded: Mapping[str, Any], renamed: Mapping[str, str | None]) -> dict[str, Any]:
    """``recorded`` (dotted keys) with each key as ``renamed`` spells it now; a key renamed to None is left out; an
    item of a renamed list (an input ``more_corpora[0]``) is renamed with its list."""
    sections = {key: now for key, now in renamed.items() if key.endswith(".")}
    result = {}
    for key, value in recorded.items():
        listed = key.split("[", 1)[0]
        if key in renamed:
            now = renamed[key]
        elif "[" in key and listed in renamed:
            now = None if renamed[listed] is None else f"{renamed[listed]}{key[len(listed):]}"
        else:
            section = next((old for old in sections if key.startswith(old)), None)
            now = key if section is None else (None if sections[section] is None
                                               else f"{sections[section]}{key[len(section):]}")
        if now is not None:
            result[now] = value
    return result


def spelled_now(settings: Mapping[str, Any], renamed: Mapping[str, str | None]) -> dict[str, Any]:
    """A recorded config (nested, as in an output folder's ``config.yaml``) as dotted keys spelled now (``renamed``:
    a config's ``RENAMED_SETTINGS``), so a folder an older version wrote reads as a new one's."""
    return _renamed(_flatten(settings), renamed)


def setting_renames(cls: type) -> dict[str, str | None]:
    """A config dataclass's ``RENAMED_SETTINGS`` (dotted key a run once recorded -> its key now, None: gone)."""
    return dict(getattr(cls, "RENAMED_SETTINGS", {}))


def setting_defaults(cls: type) -> dict[str, Any]:
    """A config dataclass's defaults as dotted keys: what a run made before a setting existed used."""
    defaults: dict[str, Any] = {}
    for spec in dataclasses.fields(cls):
        if spec.default is not dataclasses.MISSING:
            value = spec.default
        elif spec.default_factory is not dataclasses.MISSING:
            value = spec.default_factory()
        else:
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            defaults.update(_flatten(to_dict(value), f"{spec.name}."))
        else:
            defaults[spec.name] = str(value) if isinstance(value, Path) else value
    return defaults


# ---- one fingerprint per output folder: resume, or refuse ------------------------------------------------------


def check_rerun(
    output_dir: str | Path,
    fingerprint: Mapping[str, Any],
    restart: bool,
    key: str = "restart",
    *,
    file: str = RUN_FILE,
    what: str = "output_dir",
    defaults: Mapping[str, Any] = {},  # noqa: B006 (read only)
    renamed: Mapping[str, str | None] = {},  # noqa: B006 (read only)
    bookkeeping: Iterable[str] = (),
    owned: bool = False,
    clear: Callable[[Path], None] | None = None,
    fix: str | None = None,
    partial: bool = False,
) -> Literal["fresh", "resume"]:
    """Decide whether ``output_dir`` starts fresh or resumes; refuse a different run; write the fingerprint ``file``.

    ``key``: the setting that says "start over", named in the refusal; ``what``: how the user spells the folder's
    setting. A fingerprint of another ``version`` (an older selfrag's) is never resumed: refused, or ``restart``.
    ``bookkeeping``: files that are not work (a resolved config); a folder holding only those starts over quietly.
    ``owned``: the caller has claimed the folder (:func:`selfrag.fsutil.claim_output`), so a folder without a
    fingerprint is its own: refused in one line, or cleared by ``restart``. ``clear``: deletes the old outputs for
    ``restart`` (default: every entry but the owner file). ``fix``: the advice in the refusal. ``partial``: an early
    check before the slow inputs are digested: compares what ``fingerprint`` has, writes and deletes nothing.
    """
    output_dir = Path(output_dir)
    previous: Mapping[str, Any] | None = read_fingerprint(output_dir, file)
    quiet = {file, OWNER_FILE, *bookkeeping}
    entries = list(output_dir.iterdir()) if output_dir.is_dir() else []
    # an empty file is no work either: a run refused on a bad input after it opened its outputs wrote nothing
    work = [entry.name for entry in entries if entry.name not in quiet and not is_temporary(entry.name)
            and not (entry.is_file() and entry.stat().st_size == 0)]
    if previous is None:
        if work and not owned:
            raise RunMismatchError(
                f"{what} {str(output_dir)!r} is not empty and holds no {file} (it is not a selfrag "
                f"{fingerprint['stage']} run, or one from an older version); choose an empty or new {what}"
            )
        if work and not restart:  # the command's own folder, but nothing says what made its work: never reused
            raise RunMismatchError(
                f"{what} {str(output_dir)!r} holds a {fingerprint['stage']} run without {file} (an older selfrag's, "
                f"or the file was deleted); set {key}=true to delete it and start over, or choose another {what}"
            )
        if work and not partial:
            logger.warning("%s=true: deleting the run without %s in %s and starting over", key, file, output_dir)
            (clear or _clear)(output_dir)
        _finish(output_dir, file, fingerprint, partial)
        return "fresh"
    if previous.get("version") != RUN_VERSION:  # an older selfrag's: its settings and digests mean other things
        changed = [f"fingerprint version {previous.get('version')!r} of an older selfrag, expected {RUN_VERSION}"]
    else:
        changed = differences(previous, fingerprint, defaults, renamed)
    if not changed and not (restart and work):
        _finish(output_dir, file, fingerprint, partial)
        return "resume"
    if not work:  # the previous run stopped before it wrote anything (a wrong model name, a bad record)
        logger.info("%s holds no work of the run recorded in %s; starting over", output_dir, file)
        _finish(output_dir, file, fingerprint, partial)
        return "fresh"
    listing = "; ".join(changed) or "nothing: the same settings and inputs"
    if not restart:
        advice = fix or f"set {key}=true to delete it and start over, or choose another {what}"
        raise RunMismatchError(
            f"{what} {str(output_dir)!r} holds a {previous.get('stage')} run made differently ({listing}); {advice}"
        )
    if partial:
        return "fresh"
    logger.warning("%s=true: deleting the previous run in %s (it differed in %s) and starting over", key, output_dir,
                   listing)
    (clear or _clear)(output_dir)
    _finish(output_dir, file, fingerprint, partial)
    return "fresh"


def read_fingerprint(output_dir: str | Path, file: str = RUN_FILE) -> dict[str, Any] | None:
    """The fingerprint ``file`` of ``output_dir``, or None where there is none."""
    path = Path(output_dir) / file
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RunMismatchError(f"{path} is malformed ({error}); delete it or choose another output folder") from None
    if not isinstance(data, dict):
        raise RunMismatchError(f"{path} is malformed (not an object); delete it or choose another output folder")
    return data


def _finish(output_dir: Path, file: str, fingerprint: Mapping[str, Any], partial: bool) -> None:
    if not partial:
        write_json(output_dir / file, dict(fingerprint))


def _clear(output_dir: Path) -> None:
    """Delete everything in a directory known (by its fingerprint) to be a selfrag run's output, but its owner file."""
    for entry in output_dir.iterdir():
        if entry.name == OWNER_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


# ---- named pieces of work: keep, or redo --------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What :meth:`Ledger.check` found: ``new`` (no entry), ``same`` (kept) or ``changed`` (to redo, and why)."""

    state: Literal["new", "same", "changed"]
    changes: list[str] = field(default_factory=list)
    finished: bool = False


class Ledger:
    """A JSON file of named entries (``{name: {"fingerprint", "settings", "inputs", "finished"}}``): each piece of
    work's fingerprint and whether it finished. An entry an older version wrote (only a ``fingerprint`` hash) is
    ``changed``: its work is done again. An entry's digest (:meth:`digest`, what a later piece of work chains on) is
    kept while its work is the same, also where the settings are recorded otherwise since (a default added, a key
    renamed), so the work after it is kept too."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            data = json.loads(self.path.read_text(encoding="utf-8")) if self.path.is_file() else {}
        except (OSError, ValueError):
            logger.warning("%s is unreadable; everything it recorded is done again", self.path)
            data = {}
        pairs = data.items() if isinstance(data, dict) else ()
        self.entries: dict[str, dict[str, Any]] = {str(name): entry for name, entry in pairs if isinstance(entry, dict)}

    def check(
        self,
        name: str,
        fingerprint: Mapping[str, Any],
        defaults: Mapping[str, Any] = {},  # noqa: B006 (read only)
        renamed: Mapping[str, str | None] = {},  # noqa: B006 (read only)
    ) -> Verdict:
        """Compare ``name``'s entry with ``fingerprint`` and record the new one (unfinished unless it is the same).

        Anything that differs is ``changed``, with what differs; an entry of an older version (no ``settings``) too.
        ``defaults``, ``renamed``: see :func:`differences`.
        """
        entry = self.entries.get(name)
        if entry is None:
            verdict = Verdict("new")
        elif "settings" in entry:
            changes = differences(entry, fingerprint, defaults, renamed)
            verdict = Verdict("changed", changes) if changes else Verdict("same", finished=bool(entry.get("finished")))
        else:
            verdict = Verdict("changed", ["recorded by an older selfrag"])
        kept = entry.get("fingerprint") if entry is not None and verdict.state == "same" else None
        self.entries[name] = {
            **{key: value for key, value in fingerprint.items() if key != "finished"},
            "fingerprint": kept if isinstance(kept, str) else fingerprint_digest(fingerprint),
            "finished": verdict.finished,
        }
        self._save()
        return verdict

    def digest(self, name: str) -> str:
        """The digest of ``name``'s work as last checked: a new or changed entry's fingerprint digest, a same one's
        as first recorded."""
        return str(self.entries[name]["fingerprint"])

    def finished(self, name: str) -> bool:
        return bool(self.entries.get(name, {}).get("finished"))

    def finish(self, name: str, finished: bool = True) -> None:
        self.entries.setdefault(name, {})["finished"] = finished
        self._save()

    def forget(self, names: Iterable[str]) -> None:
        for name in names:
            self.entries.pop(name, None)
        self._save()

    def __iter__(self) -> Any:
        return iter(list(self.entries))

    def _save(self) -> None:
        write_json(self.path, self.entries)


# ---- helpers ------------------------------------------------------------------------------------------------


def _flatten(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = str(value) if isinstance(value, Path) else value
    return flat


def _under(key: str, prefixes: Iterable[str]) -> bool:
    return any(key == prefix or key.startswith(f"{prefix}.") for prefix in prefixes)


def _short(digest: str | None) -> str:
    if digest is None:
        return "none"
    return digest.split(":", 1)[-1][:12] if digest.startswith("sha256:") else digest  # a version, not a digest


def _show(value: Any, missing: object) -> str:
    return "unset" if value is missing else repr(value)


def is_temporary(name: str) -> bool:
    """An atomic writer's temp sibling (``.NAME.tmp-PID``), left by a kill: never work of a run."""
    return name.startswith(".") and ".tmp" in name
