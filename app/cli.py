"""The ``selfrag`` command line.

    selfrag quickstart                                   # demo data -> LoRA on SmolLM2 -> answers
    selfrag generate --config configs/data_gen/squad-demo.yaml output=runs/data
    selfrag paper-data import selfrag_train_data/train.jsonl runs/paper/records.jsonl
    selfrag train --config configs/train/smollm2-135m-cpu.yaml records=runs/data/records.jsonl output_dir=runs/model
    selfrag rl --config configs/rl/smollm2-135m-cpu.yaml model=runs/model output_dir=runs/model-rl
    selfrag ask model=runs/model retriever.corpus=data_gen/demo/corpus.jsonl "Who ruled Normandy?"
    selfrag index corpus=data_gen/demo/corpus.jsonl output=runs/index kind=bm25
    selfrag eval --config configs/eval/demo.yaml model=runs/model output_dir=runs/eval
    selfrag serve model=runs/model retriever.index=runs/index port=8000
    selfrag audit runs/data                              # review teacher labels; --report prints the agreement

Every setting is a ``key=value`` word over an optional ``--config FILE``, in every command: the model is ``model=``,
the retriever is the ``retriever`` section (``retriever.index=DIR``, ``retriever.url=postgresql://...``,
``retriever.corpus=FILE``). The options that once named them (``--model``, ``--corpus``, ``--index``, serve's
``--port`` ...) are refused with the key to write instead (:data:`GONE_OPTIONS`).

Each command only parses its arguments and calls the stage's ``run(config)``. A user's mistake (a
missing file, a malformed line, an unknown key or model, a package of an extra not installed) prints one line
per problem, no traceback, exit code 2; ``--help-config`` works on every command without its other arguments.

``selfrag ask``: a word that starts like ``name=`` (``inference.mode=always``, ``inference.top_k=5``) is an override,
in any position; the other word is the question (exactly one: quote it). A question that itself starts like
``name=...`` is given with ``-q/--question``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
import typing
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from selfrag.errors import SelfragError, UsageError
from selfrag.extras import missing_extra

#: How long a process other than the main one waits before exiting on an error the main one reports (the launcher
#: stops every process as soon as one exits).
QUIET_PROCESS_GRACE_S = 5.0

logger = logging.getLogger("selfrag")

class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (what is wrong and where to look), exit code 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def _add_config_arguments(parser: argparse.ArgumentParser, positional: bool = True) -> None:
    parser.add_argument("--config", type=Path, help="YAML config file (see configs/)")
    if positional:
        parser.add_argument(
            "overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. training.max_steps=5"
        )
    else:
        parser.set_defaults(overrides=[])
    parser.add_argument("--help-config", action="store_true", help="list every config key with its help and exit")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="selfrag", description="Reflection-token Self-RAG toolkit.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    generate = commands.add_parser("generate", help="label trajectories (gold or teacher labels)")
    _add_config_arguments(generate)
    generate_merge = commands.add_parser("generate-merge", help="join the outputs of shard=i/N generate runs")
    _add_config_arguments(generate_merge)
    paper = commands.add_parser(
        "paper-data", help="the paper's released training data (selfrag_train_data) <-> trajectory records"
    )
    paper.add_argument("direction", choices=("import", "export"), help="import: paper -> records; export: back")
    paper.add_argument("source", type=Path, help="import: the paper's JSONL (or JSON array); export: records JSONL")
    paper.add_argument("target", type=Path, help="the JSONL file to write")
    train = commands.add_parser("train", help="LoRA fine-tune a model to emit reflection tokens (TRL + PEFT)")
    _add_config_arguments(train)
    rl = commands.add_parser("rl", help="GRPO on a trained model's answers, with retrieval in the loop (TRL)")
    _add_config_arguments(rl)
    export = commands.add_parser("export", help="merge a trained adapter into a full model (loads without PEFT)")
    export.add_argument("adapter", type=Path, help="adapter directory written by selfrag train")
    export.add_argument("output", type=Path, help="a new (or empty) directory for the merged model")

    ask = commands.add_parser("ask", help="answer questions, showing the reflection decisions")
    ask.add_argument(
        "words", nargs="*", metavar="QUESTION|key=value",
        help="the question (quoted), and settings: model=DIR retriever.index=DIR (or retriever.corpus=FILE) "
             "inference.top_k=5",
    )
    ask.add_argument("-q", "--question", help="the question; use this when the question itself contains '='")
    ask.add_argument("--questions", help="a file of questions, one per line or JSONL {question}; - reads stdin")
    ask.add_argument("--json", action="store_true", help="print answers as JSON (one object per line for several)")
    _add_config_arguments(ask, positional=False)

    index = commands.add_parser(
        "index", help="build a retrieval index (BM25, dense, or a shared pgvector table) once, for every stage"
    )
    _add_config_arguments(index)

    evaluate = commands.add_parser("eval", help="compare no retrieval, plain RAG, prompted and single-pass Self-RAG")
    _add_config_arguments(evaluate)
    calibrate = commands.add_parser("calibrate", help="measure the retrieval threshold and support bound (dev split)")
    _add_config_arguments(calibrate)

    serve = commands.add_parser("serve", help="OpenAI-compatible server (POST /v1/chat/completions, /health, /metrics)")
    _add_config_arguments(serve)

    audit = commands.add_parser("audit", help="review a sample of a generate run's teacher labels in a local page")
    audit.add_argument("data_dir", type=Path, metavar="DATA_DIR", help="the output folder of `selfrag generate`")
    audit.add_argument("--report", action="store_true", help="print (and write) the agreement report, start no page")
    audit.add_argument("--port", type=int, help="TCP port on 127.0.0.1 (default: a free one)")
    audit.add_argument("--per-stratum", type=int, help="labels sampled per type and teacher label (default 10)")
    audit.add_argument("--seed", type=int, help="the sample's seed (default 0)")

    pg = commands.add_parser("pg", help="a local PostgreSQL + pgvector server for retriever.url (pgserver's binaries)")
    pg.add_argument("action", choices=("start", "stop", "status"), help="start it in the background, stop it, or ask")
    pg.add_argument("directory", type=Path, help="the server's folder (created; keeps its data between starts)")
    pg.add_argument("--port", type=int, help="TCP port on 127.0.0.1 (default: the one it used last, else a free one)")
    quickstart = commands.add_parser(
        "quickstart", help="run everything on the demo data on CPU (prints an estimate once training starts)")
    _add_config_arguments(quickstart)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = _parse(parser, argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    _quiet_libraries()
    try:
        return COMMANDS[args.command](args)
    except SelfragError as error:
        # several processes fail alike (training.distributed): the main one says why, unless it is the one lost
        if os.environ.get("RANK", "0") == "0" or getattr(error, "every_process", False):
            for problem in getattr(error, "problems", None) or [str(error)]:
                print(f"selfrag {args.command}: error: {_one_line(problem)}", file=sys.stderr)
        else:
            # a quiet process that exits first makes the launcher stop the main one before it has said why
            time.sleep(QUIET_PROCESS_GRACE_S)
        return 2
    except OSError as error:
        # A model or file the system cannot give (an unreachable hub id, a full disk, no permission):
        # one line; -v shows where it came from.
        if args.verbose:
            raise
        print(f"selfrag {args.command}: error: {_os_error_line(error)} (run with -v for details)", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        # an optional package an extra installs (uvicorn for serve, ...): one line naming the extra; -v: traceback
        missing = missing_extra(error)
        if missing is None or args.verbose:
            raise
        print(f"selfrag {args.command}: error: {_one_line(str(missing))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"selfrag {args.command}: {INTERRUPTED[args.command]}", file=sys.stderr)
        return 130


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; words after options are overrides too, and ``--help-config`` needs no other argument."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "--help-config" in argv:
        command = next((word for word in argv if word in commands.choices), None)
        if command is not None:
            chosen = commands.choices[command]
            if not any("--help-config" in action.option_strings for action in chosen._actions):
                print(f"selfrag {command} has no config keys; its arguments:\n{chosen.format_usage()}", end="")
                raise SystemExit(0)
            for action in chosen._actions:  # --help-config prints and exits before these are used
                action.required = False
                if action.nargs is None and not action.option_strings:
                    action.nargs = "?"
    args, extras = parser.parse_known_args(argv)
    sub = commands.choices[args.command]
    options = [word for word in extras if word.startswith("-") and not _NUMBER.match(word)]
    for option in options:
        instead = GONE_OPTIONS.get(args.command, {}).get(option.split("=", 1)[0])
        if instead is not None:
            sub.error(f"{option.split('=', 1)[0]} is gone: write {instead}")
    if options:
        sub.error(f"unrecognized option {options[0]!r}")
    if extras:
        if not hasattr(args, "overrides") and not hasattr(args, "words"):
            sub.error(f"unrecognized arguments: {' '.join(extras)}")
        target = "words" if hasattr(args, "words") else "overrides"
        setattr(args, target, [*getattr(args, target), *extras])
    return args


_NUMBER = re.compile(r"^-\d")
_RETRIEVER_OPTIONS = {
    "--corpus": "retriever.corpus=FILE (BM25 built now)",
    "--index": "retriever.index=DIR (retriever.url=postgresql://...?table=NAME for pgvector)",
    "--chunk-words": "retriever.chunk_words=N",
    "--chunk-overlap": "retriever.chunk_overlap=N",
}
_RUNNING = {"--model": "model=DIR", **_RETRIEVER_OPTIONS, "--engine": "inference.engine=hf|vllm|openai"}
#: command -> option that once named a setting -> the key=value to write instead (the one CLI style; refused, exit 2)
GONE_OPTIONS: dict[str, dict[str, str]] = {
    "ask": _RUNNING,
    "serve": {**_RUNNING, "--host": "host=ADDRESS", "--port": "port=N"},
    "eval": _RUNNING,
    "calibrate": _RUNNING,
    "rl": {"--model": "model=DIR", **_RETRIEVER_OPTIONS},
    "train": {"--model": "model=NAME"},
    "quickstart": {"--model": "model=NAME"},
}
#: An override: a dotted key, then ``=``. A question never starts like this unless it holds ``name=``.
OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*=")


def _one_line(text: str) -> str:
    return " ".join(str(text).splitlines())  # \r, \v, \u2028 ... too: a user's text never breaks the line


def _os_error_line(error: OSError) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else type(error).__name__
    text = text if len(text) <= 300 else text[:297] + "..."
    if "huggingface.co" in text and ("connect" in text or "resolve" in text.lower()):
        # An unreachable hub id: say what to do instead of only what failed.
        text = text.rstrip(".") + (
            "; the hub is unreachable from here: give a local model directory or a built-in name, or download it "
            "where the hub is reachable (HF_HUB_OFFLINE=1 fails at once instead of retrying)"
        )
    return text


def _quiet_libraries() -> None:
    # Deprecation notices from transformers/TRL internals are for their developers, not selfrag's users.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    for name in ("httpx", "urllib3", "datasets", "bm25s"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("huggingface_hub.utils._http").setLevel(logging.ERROR)  # five "Retrying in 8s" lines
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass


def _config(cls: type, args: argparse.Namespace, **base: Any) -> Any:
    from selfrag.config import describe, load_config
    from selfrag.fsutil import check_config_outputs

    if args.help_config:
        print("\n".join(describe(cls)))
        raise SystemExit(0)
    config: Any = load_config(cls, args.config, args.overrides, **base)
    check_config_outputs(config)
    return config


def _generate(args: argparse.Namespace) -> int:
    from selfrag.config import check_recipe_pairs
    from selfrag.data_gen.config import GenerateConfig
    from selfrag.data_gen.run import run

    check_recipe_pairs(args.config, args.overrides, "queries", corpus_key="passages")

    result = run(_config(GenerateConfig, args))
    print(result.summary())
    for problem in result.problems:  # the outputs are written, but the run did not do its job
        print(f"selfrag generate: error: {_one_line(problem)}", file=sys.stderr)
    return 1 if result.problems else 0


def _generate_merge(args: argparse.Namespace) -> int:
    from selfrag.data_gen.merge import MergeConfig, merge

    config = _config(MergeConfig, args)
    stats = merge(config)
    records = stats.get("records")
    print(f"merged {len(config.shards)} shards into {config.output}: {json.dumps(records)} records")
    return 0


def _paper_data(args: argparse.Namespace) -> int:
    from selfrag.data_gen.paper_data import export_file, import_file
    from selfrag.fsutil import claim_output_file, mark_output_file

    command = f"selfrag paper-data {args.direction}"  # a file of the user's, or of another command, is not overwritten
    claim_output_file(args.target, command, key="target", inputs=[args.source])
    if args.direction == "import":
        print(import_file(args.source, args.target).summary(args.target))
    else:
        print(f"exported {export_file(args.source, args.target)} records to {args.target}")
    mark_output_file(args.target, command)
    return 0


def _train(args: argparse.Namespace) -> int:
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import run

    result = run(_config(TrainConfig, args))
    if os.environ.get("RANK", "0") == "0":  # launched as several processes: the main one reports
        print(result.summary())
    return 0


def _rl(args: argparse.Namespace) -> int:
    from selfrag.rl.config import RLConfig
    from selfrag.rl.run import run

    print(run(_config(RLConfig, args)).summary())
    return 0


def _export(args: argparse.Namespace) -> int:
    from selfrag.training.export import export

    path = export(args.adapter, args.output)
    print(f"merged model written to {path}")
    return 0


def _ask(args: argparse.Namespace) -> int:
    from selfrag.inference.ask import AskConfig, ask_many, format_answer, read_questions

    if args.help_config:
        question, args.overrides = "", []
    elif args.questions is not None:
        args.overrides = [word for word in args.words if OVERRIDE.match(word)]
        extra = [word for word in args.words if not OVERRIDE.match(word)]
        if extra or args.question is not None:
            raise UsageError("give one question, or --questions FILE (- for stdin), not both")
    else:
        question, args.overrides = split_question(args.words, args.question)
    config = _config(AskConfig, args)
    questions = [question] if args.questions is None else read_questions(args.questions, sys.stdin)
    answers = ask_many(config, questions)
    for question, answer in zip(questions, answers, strict=True):
        if args.json and len(answers) == 1:
            print(json.dumps(answer.to_json(), indent=2, ensure_ascii=False))
        elif args.json:
            print(json.dumps({"question": question, **answer.to_json()}, ensure_ascii=False))
        else:
            print(f"Q: {question}\n{format_answer(answer)}\n" if len(answers) > 1 else format_answer(answer))
    return 0


def _index(args: argparse.Namespace) -> int:
    from selfrag.inference.retrievers.index import IndexConfig
    from selfrag.inference.retrievers.index_build import run

    print(run(_config(IndexConfig, args)).summary())
    return 0


def split_question(words: Sequence[str], flag: str | None) -> tuple[str, list[str]]:
    """``selfrag ask`` words -> (question, overrides): ``key=value`` words are overrides, the rest the question.

    A question that itself starts like ``name=...`` must be given with ``-q``; exactly one question is taken.
    """
    overrides = [word for word in words if OVERRIDE.match(word)]
    rest = [word for word in words if not OVERRIDE.match(word)]
    if flag is not None and rest:
        raise UsageError(f"give the question once: got --question and also {rest[0]!r}; quote one question")
    if flag is None and not rest:
        raise UsageError(
            'no question given; write it in quotes, e.g. selfrag ask model=M retriever.index=I "Who ruled Normandy?" '
            "(use -q/--question when the question contains '=')"
        )
    if len(rest) > 1:
        raise UsageError(
            f"got {len(rest)} questions ({', '.join(repr(word) for word in rest[:3])}); put the question in quotes "
            "as one argument, and write settings as key=value"
        )
    question = flag if flag is not None else rest[0]
    if not question.strip():
        raise UsageError("the question is empty; write the question in quotes")
    return question, overrides


def _eval(args: argparse.Namespace) -> int:
    from selfrag.config import check_recipe_pairs
    from selfrag.evaluation.config import EvalConfig
    from selfrag.evaluation.run import run

    check_recipe_pairs(args.config, args.overrides)

    print(run(_config(EvalConfig, args)).summary())
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from selfrag.config import check_recipe_pairs
    from selfrag.evaluation.calibrate import run
    from selfrag.evaluation.config import CalibrateConfig

    check_recipe_pairs(args.config, args.overrides)

    print(run(_config(CalibrateConfig, args)).summary())
    return 0


def _serve(args: argparse.Namespace) -> int:
    from selfrag.inference.server.config import ServeConfig

    config = _config(ServeConfig, args)  # --help-config and a config mistake need no server package
    from selfrag.inference.server.run import run

    return run(config)


def _audit(args: argparse.Namespace) -> int:
    from selfrag.data_gen.audit_server import run

    return run(args.data_dir, report=args.report, port=args.port, per_stratum=args.per_stratum, seed=args.seed)


def _pg(args: argparse.Namespace) -> int:
    from selfrag.inference.retrievers.localpg import USER, LocalPostgres

    server = LocalPostgres(args.directory, port=args.port)
    up = server.running()
    if args.action == "stop":
        if up:
            server.stop()
        print(f"stopped the server in {args.directory}" if up else f"no server is running in {args.directory}")
        return 0
    if args.action == "start" and not up:
        server.start()
    elif args.action == "status" and not up:
        print(f"no server is running in {args.directory}; start one: selfrag pg start {args.directory}")
        return 1
    url = f"postgresql://{USER}@127.0.0.1:{server.port}/postgres?table=passages"  # the password stays in a file
    print(f"PostgreSQL + pgvector {'started' if args.action == 'start' and not up else 'running'} on "
          f"127.0.0.1:{server.port} (folder {args.directory}); stop it: selfrag pg stop {args.directory}\n"
          f"  export PGPASSWORD=$(cat {args.directory / 'password'})\n"
          f"  selfrag index kind=pgvector corpus=FILE output='{url}'\n"
          f"  then retriever.url='{url}' in any command")
    return 0


def _quickstart(args: argparse.Namespace) -> int:
    from selfrag.app.quickstart import QuickstartConfig, run

    run(_config(QuickstartConfig, args))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "generate": _generate,
    "generate-merge": _generate_merge,
    "paper-data": _paper_data,
    "train": _train,
    "rl": _rl,
    "export": _export,
    "ask": _ask,
    "index": _index,
    "eval": _eval,
    "calibrate": _calibrate,
    "quickstart": _quickstart,
    "serve": _serve,
    "audit": _audit,
    "pg": _pg,
}

_RESUME = "interrupted; run the same command again to resume"
_START_OVER = "interrupted; this command does not resume: run the same command again to start over"
#: what Ctrl-C leaves, said as what running the same command again does (the promise to resume only where it does)
INTERRUPTED: dict[str, str] = {
    "generate": _RESUME,  # the journal keeps every finished question
    "train": _RESUME,  # SaveOnInterrupt: a checkpoint at the end of the step
    "rl": _RESUME,
    "index": _RESUME,  # the passage store and finished shards are kept
    "eval": _RESUME,  # each mode's answers are kept batch by batch
    "quickstart": _RESUME,  # each stage resumes or is skipped when done
    "calibrate": _START_OVER,
    "export": _START_OVER,  # staged: the output appears whole or not at all
    "paper-data": _START_OVER,  # written atomically
    "generate-merge": "interrupted; its output folder may hold part of the merge: delete it, then run the same "
                      "command again",  # the merge refuses a non-empty output
    "ask": "interrupted",
    "serve": "interrupted",
    "audit": "interrupted",
    "pg": "interrupted",
}


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
