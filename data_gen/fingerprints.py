"""What a generate run's output was made from, by content, on the shared rerun mechanism (:mod:`selfrag.runs`).

    check_output(config, output, CONTENT_SETTINGS, {"passages": passages_digest(passages)}, clear=start_over)

A path names a file, not what is in it: a passages or query file edited in place (same path, new lines) must not
resume as if nothing happened, and the same content under another path (an output folder or its inputs moved
elsewhere) is the same run. ``fingerprint.json`` in the output holds the content settings and the SHA-256 of each
input (and ``selfrag.sentences.SPLITTER``: labels split into other sentences are other
records); a rerun with other ones is refused with one line naming each (``restart=true`` starts over). The teacher
path also keeps one digest per question in its journal (:func:`query_digest`), so a question whose text or answer
changed is labelled again while the unchanged ones resume. A folder an older version wrote (no ``fingerprint.json``,
or one of another version) is refused in one line; ``restart=true`` starts over.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from selfrag.config import to_dict
from selfrag.corpus import Query
from selfrag.data_gen.config import GenerateConfig
from selfrag.runs import check_rerun, content_digest, run_fingerprint, setting_defaults, setting_renames
from selfrag.trajectory import Passage

FINGERPRINT_FILE = "fingerprint.json"
CONFIG_FILE = "config.yaml"
#: Inputs compared by their content digest: their path settings are not part of the fingerprint.
INPUT_SETTINGS = ("passages", "queries")


def passages_digest(passages: Sequence[Passage]) -> str:
    """The passages as read (a file, or a folder's chunks): ids, titles and texts in order."""
    return content_digest([passage.to_json() for passage in passages])


def query_digest(query: Query, seed_passage: Passage | None = None) -> str:
    """One question as the labeler sees it (and, for a teacher-written question, the passage it comes from)."""
    return content_digest({"query": query.to_json(), "seed": None if seed_passage is None else seed_passage.to_json()})


def check_output(
    config: GenerateConfig,
    output: Path,
    keys: Sequence[str],
    digests: Mapping[str, str],
    clear: Callable[[Path], None],
    bookkeeping: Iterable[str] = (),
    fix: str | None = None,
    partial: bool = False,
) -> Literal["fresh", "resume"]:
    """Refuse to resume into ``output`` made with other content settings (``keys``) or inputs, naming each, unless
    ``restart`` (then ``clear`` deletes the earlier outputs); see :func:`selfrag.runs.check_rerun`."""
    keep = [key for key in keys if key not in INPUT_SETTINGS]
    fingerprint = run_fingerprint("generate", to_dict(config), keep=keep, digests=digests, root=output)
    return check_rerun(
        output, fingerprint, config.restart, file=FINGERPRINT_FILE, what="output", owned=True, clear=clear,
        defaults=setting_defaults(GenerateConfig), renamed=setting_renames(GenerateConfig),
        bookkeeping=(CONFIG_FILE, *bookkeeping), partial=partial,
        fix=fix or "use a new output directory, set the old values to resume, or pass restart=true to start over",
    )
