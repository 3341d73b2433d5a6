"""Generate labelled trajectory records from a corpus and a query set: the dispatch of `selfrag generate`.

    selfrag generate --config configs/data_gen/squad-demo.yaml output=runs/demo-data
    selfrag generate --config configs/data_gen/http-teacher.yaml teacher.model=gpt-4o-mini output=runs/data

``labeler=gold`` derives labels from a data set's annotations (:mod:`selfrag.data_gen.gold_run`);
``labeler=llm`` asks a teacher for every label (:mod:`selfrag.data_gen.teacher_run`, locally or on Ray).
An output URL (s3://, file://, memory://) runs in a local copy kept in step (:mod:`selfrag.data_gen.url_output`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from selfrag.data_gen.config import GenerateConfig
from selfrag.data_gen.fingerprints import CONFIG_FILE, FINGERPRINT_FILE
from selfrag.data_gen.gold_outputs import RECORDS_FILE
from selfrag.data_gen.gold_run import STATS_FILE, GenerateResult, run_gold
from selfrag.fsutil import check_output_path, claim_output, hold_output, is_url, left_clean_if_refused

__all__ = ["GenerateResult", "run"]


def run(config: GenerateConfig) -> GenerateResult:
    if is_url(config.output):  # s3://, file://, memory://: the run works in a local copy kept in step with the URL
        from selfrag.data_gen.url_output import run_at_url

        return run_at_url(config, run)  # type: ignore[no-any-return]
    config = replace(config, output=str(Path(config.output).expanduser()))
    check_output_path(config.output, inputs=[config.passages, config.queries])
    # a run refused on its inputs (a wrong gold id, no query in the split) leaves no folder behind
    with left_clean_if_refused(config.output, bookkeeping=(FINGERPRINT_FILE, CONFIG_FILE)):
        # Before anything is read or written: the output is new, empty, or an earlier `selfrag generate` run
        # (resumed), never a folder of the user's files or another command's output (an index's config.yaml was
        # overwritten once).
        with hold_output(config.output, "generate", key="output"):  # a second run into it is refused
            claim_output(config.output, "generate")
            return _run_local(config)


def _run_local(config: GenerateConfig) -> GenerateResult:
    if config.labeler == "llm":
        from selfrag.data_gen.teacher_run import run_llm, run_problems, summarize

        stats = run_llm(config)
        output = Path(config.output)
        written = stats["run"]["questions_labelled_now"]
        message, problems = summarize(stats, output), tuple(run_problems(stats, output))
        return GenerateResult(output, output / RECORDS_FILE, output / STATS_FILE, written, stats, message, problems)
    return run_gold(config)
