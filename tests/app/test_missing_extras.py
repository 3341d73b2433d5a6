"""A package of an extra that is not installed: one line naming the extra, exit code 2, never a traceback.

`selfrag serve` right after the quickstart's set-up (no extras) ended in ``ModuleNotFoundError: No module named
'uvicorn'`` and a traceback. Each test blocks one optional package (``sys.modules[name] = None`` makes its import
fail as if it were absent) and runs the command through the CLI's ``main``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from selfrag.app.cli import COMMANDS, main
from selfrag.data_gen import DEMO_CORPUS
from selfrag.extras import EXTRAS, MissingExtraError, missing_extra, require

REPO = Path(__file__).parents[2]


def block(monkeypatch: pytest.MonkeyPatch, *names: str, reload: tuple[str, ...] = ()) -> None:
    """Make ``import name`` fail for each of ``names``; drop the ``reload`` modules so they import again."""
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)
    for module in reload:
        monkeypatch.delitem(sys.modules, module, raising=False)


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("selfrag ")]  # no progress bars
    assert code == 2, err
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def test_serve_without_the_server_extra_names_it(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    block(monkeypatch, "uvicorn", reload=("selfrag.inference.server.run",))
    line = one_line_error(capsys, ["serve", f"model={tmp_path}", f"retriever.corpus={DEMO_CORPUS}"])
    assert line.startswith("selfrag serve: error: uvicorn is not installed here"), line
    assert "pip install -e '.[server]'" in line


def test_serve_help_config_needs_no_server_package(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    block(monkeypatch, "uvicorn", "fastapi", reload=("selfrag.inference.server.run", "selfrag.inference.server.app"))
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help-config"])
    assert exit_.value.code == 0 and "port (" in capsys.readouterr().out


def test_dense_index_without_the_dense_extra(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    block(monkeypatch, "sentence_transformers")
    line = one_line_error(capsys, ["index", f"corpus={DEMO_CORPUS}", f"output={tmp_path / 'dense'}", "kind=dense"])
    assert "sentence-transformers, which is not installed here" in line and "pip install -e '.[dense]'" in line, line


def test_pg_start_without_pgserver(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    block(monkeypatch, "pgserver")
    line = one_line_error(capsys, ["pg", "start", str(tmp_path / "pg")])
    assert "pgserver, which is not installed here" in line and "pip install -e '.[pgvector]'" in line, line


def test_pgvector_retriever_without_psycopg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from selfrag.inference.retrievers.pgvector import connect, parse_url

    block(monkeypatch, "psycopg")
    with pytest.raises(MissingExtraError, match=re.escape("pip install -e '.[pgvector]'")):
        connect(parse_url("postgresql://u@127.0.0.1:1/db?table=t"))


def test_one_install_line_for_each_extra() -> None:
    """Every extra :data:`EXTRAS` names exists in pyproject.toml, so its install line works."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    declared = set(re.findall(r"^(\w+) = \[", text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0],
                              re.MULTILINE))
    assert set(EXTRAS.values()) <= declared


def test_other_import_errors_keep_their_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module that is no optional package's is a bug or a broken install, not a missing extra."""
    assert missing_extra(ModuleNotFoundError("No module named 'nosuch'", name="nosuch")) is None
    assert missing_extra(ModuleNotFoundError("No module named 'uvicorn.x'", name="uvicorn.x")) is not None
    block(monkeypatch, "faiss")
    with pytest.raises(MissingExtraError, match=re.escape("kind=faiss needs FAISS, which is not installed here")):
        require("faiss", "kind=faiss")


def test_a_real_process_prints_the_line_without_traceback(tmp_path: Path) -> None:
    script = (
        "import sys; sys.modules['uvicorn'] = None\n"
        "from selfrag.app.cli import main\n"
        f"sys.exit(main(['serve', 'model={tmp_path}', 'retriever.corpus={DEMO_CORPUS}']))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "pip install -e '.[server]'" in result.stderr


def readme_commands() -> list[str]:
    """Every command line of the README's ``bash`` blocks (a line ending in a backslash joined with the next)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = []
    for block_text in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block_text.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def test_every_readme_command_exists() -> None:
    """Each README command names a selfrag subcommand (and a --config file that is there), a module that imports,
    or a script that is there."""
    import importlib.util

    commands = readme_commands()
    assert len(commands) > 20
    for line in commands:
        words = [word for word in line.split() if not re.match(r"^[A-Z_]+=", word)]  # VAR=value before a command
        if words[0] == "selfrag":
            assert words[1] in COMMANDS, line
            if "--config" in words:
                assert (REPO / words[words.index("--config") + 1]).is_file(), line
        elif words[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(words[2]) is not None, line
        elif words[0] == "bash":
            assert (REPO / words[1]).is_file(), line
        else:
            assert words[0] == "export", line


def test_the_quickstart_set_up_installs_what_serve_imports() -> None:
    """The quickstart's next steps are ask, serve and eval: its set-up (setup.sh --quickstart) installs the extra of
    every optional package the server's modules import."""
    import ast

    setup = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    found = re.search(r"^QUICKSTART_EXTRAS=(\S+)", setup, re.MULTILINE)
    assert found is not None and '-e ".[$QUICKSTART_EXTRAS]"' in setup
    installed = set(found.group(1).split(","))
    needed = set()
    for path in (REPO / "inference" / "server").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            needed |= {EXTRAS[name.split(".")[0]] for name in names if name.split(".")[0] in EXTRAS}
    assert needed and needed <= installed, (needed, installed)
