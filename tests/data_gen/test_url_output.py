"""output=<fsspec URL> on real fsspec filesystems (memory:// in this process, file:// across a killed process): the
shards and manifest give the local run's files back byte for byte, a rerun resumes from the URL's journal, other
settings are refused, a URL of someone else's files is refused, and a killed run resumes without redoing a
journaled question."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import fsspec
import pytest
from teacher_server import TeacherServer
from test_teacher_run import QUERIES, generate, overrides

from selfrag.data_gen.outputs import OUTPUT_FILES
from selfrag.errors import ConfigError, InputError

JSONL_OUTPUTS = [name for name in OUTPUT_FILES if name.endswith(".jsonl")]


@pytest.fixture(autouse=True)
def own_staging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SELFRAG_CACHE", str(tmp_path / "selfrag-cache"))  # the staging folders live there


@pytest.fixture
def memory_url():  # type: ignore[no-untyped-def]
    url = f"memory://selfrag-tests/{uuid.uuid4().hex}/run"
    yield url
    fs, root = fsspec.core.url_to_fs(url)
    if fs.exists(root):
        fs.rm(root, recursive=True)


def joined_shards(url: str) -> dict[str, bytes]:
    """Each .jsonl output as the manifest's shards give it back; checks every shard's line count and SHA-256."""
    import hashlib

    fs, root = fsspec.core.url_to_fs(url)
    manifest = json.loads(fs.cat_file(f"{root}/manifest.json"))
    files = {}
    for name, entry in manifest["files"].items():
        parts = []
        for shard in entry["shards"]:
            data = fs.cat_file(f"{root}/{shard['path']}")
            assert shard["sha256"] == "sha256:" + hashlib.sha256(data).hexdigest()
            assert shard["lines"] == data.count(b"\n")
            parts.append(data)
        files[name] = b"".join(parts)
    return files


def read_url(url: str, name: str) -> bytes:
    fs, root = fsspec.core.url_to_fs(url)
    return fs.cat_file(f"{root}/{name}")  # type: ignore[no-any-return]


def test_memory_url_matches_the_local_run_and_resumes_from_its_journal(tmp_path: Path, memory_url: str) -> None:
    from teacher_inputs import write_inputs

    data = write_inputs(tmp_path, QUERIES)
    shards = "ray.shard_records=2"
    with TeacherServer() as server:
        local = generate(server.url, data, tmp_path / "local")
        server.answered.clear()
        first = generate(server.url, data, memory_url, shards, f"teacher.cache={tmp_path / 'url.sqlite'}")
        calls = len(server.answered)
        again = generate(server.url, data, memory_url, shards, f"teacher.cache={tmp_path / 'other.sqlite'}")
        assert len(server.answered) == calls  # every question came back from the URL's journal, no call made
    assert calls == local.stats["run"]["teacher_calls_made"] and not first.problems
    files = joined_shards(memory_url)
    assert set(files) == set(JSONL_OUTPUTS)
    for name in JSONL_OUTPUTS:
        assert files[name] == (tmp_path / "local" / name).read_bytes(), name
    assert json.loads(read_url(memory_url, "stats.json")) == json.loads((tmp_path / "local" / "stats.json").read_text())
    run = json.loads(read_url(memory_url, "run.json"))
    assert run["questions_already_done"] == len(QUERIES) and run["teacher_calls_made"] == 0
    assert again.stats["run"]["questions_labelled_now"] == 0
    assert f"in {memory_url}" in again.summary()  # the URL, not the local staging folder
    config = read_url(memory_url, "config.yaml").decode()
    assert f"output: {memory_url}" in config
    assert json.loads(read_url(memory_url, ".selfrag-output.json"))["command"] == "generate"


def test_url_resume_refuses_other_settings_and_restart_replaces_the_journal(tmp_path: Path, memory_url: str) -> None:
    from teacher_inputs import write_inputs

    data = write_inputs(tmp_path, QUERIES[:3])
    fs, root = fsspec.core.url_to_fs(memory_url)
    with TeacherServer() as server:
        generate(server.url, data, memory_url)
        before = fs.ls(f"{root}/journal", detail=False)
        made_differently = r"output 'memory://.*' holds a generate run made differently \(top_k=2 \(was 3\)\)"
        with pytest.raises(ConfigError, match=made_differently):  # the URL named, not the staging folder
            generate(server.url, data, memory_url, "top_k=2")
        assert fs.ls(f"{root}/journal", detail=False) == before  # the refusal changed nothing at the URL
        generate(server.url, data, memory_url, "top_k=2", "restart=true")
        # the input digests travel with the URL (fingerprint.json): a corpus edited in place is refused there too
        assert "passages" in json.loads(read_url(memory_url, "fingerprint.json"))["inputs"]
        data[0].write_text(data[0].read_text().replace("Seine", "Loire"))
        with pytest.raises(ConfigError, match=r"output 'memory://.*' holds .*passages: content changed"):
            generate(server.url, data, memory_url, "top_k=2")
    parts = [fs.cat_file(part) for part in sorted(fs.ls(f"{root}/journal", detail=False))]
    entries = [json.loads(line) for part in parts for line in part.splitlines()]
    assert sorted(entry["query_id"] for entry in entries) == ["q1", "q2", "q3"]  # the old run's parts are gone
    assert "top_k: 2" in read_url(memory_url, "config.yaml").decode()


def test_a_url_holding_other_files_or_an_unknown_scheme_is_one_clear_line(tmp_path: Path, memory_url: str) -> None:
    from teacher_inputs import write_inputs

    data = write_inputs(tmp_path, QUERIES[:1])
    fs, root = fsspec.core.url_to_fs(memory_url)
    fs.pipe_file(f"{root}/notes.txt", b"mine")
    with pytest.raises(InputError, match=r"is not empty and was not written by `selfrag generate` \(it holds notes"):
        generate("http://127.0.0.1:9/v1", data, memory_url)
    assert fs.ls(root, detail=False) == [f"{root}/notes.txt"]  # nothing written beside the user's file
    with pytest.raises(InputError, match=r"is an existing file, not a folder"):
        generate("http://127.0.0.1:9/v1", data, f"memory://{root}/notes.txt")
    with pytest.raises(InputError, match=r"Protocol not known: nosuch; give an fsspec URL"):
        generate("http://127.0.0.1:9/v1", data, "nosuch://bucket/run")
    with TeacherServer() as server:
        generate(server.url, data, tmp_path / "local-run")
    with pytest.raises(InputError, match=r"holds a run written as a local directory \(journal.jsonl\); resume it"):
        generate("http://127.0.0.1:9/v1", data, f"file://{tmp_path / 'local-run'}")
    with pytest.raises(ConfigError, match=r"a URL output needs labeler=llm"):
        generate("http://127.0.0.1:9/v1", data, memory_url, "labeler=gold")


def test_file_url_killed_mid_run_resumes_without_redoing_journaled_questions(tmp_path: Path) -> None:
    from teacher_inputs import write_inputs

    many = [dict(q, id=f"{q['id']}-{n}", question=f"{q['question']} (variant {n})") for n in range(3) for q in QUERIES]
    data = write_inputs(tmp_path, many)
    url = f"file://{tmp_path}/remote/run"
    journal = tmp_path / "remote" / "run" / "journal"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    extra = ["teacher.engine_options.concurrency=2", "output_sync_s=0.05",
             f"teacher.cache={tmp_path / 'killed.sqlite'}"]
    with TeacherServer(latency=0.02) as server:
        generate(server.url, data, tmp_path / "whole", "teacher.engine_options.concurrency=2")
        total = len(server.usable_answered())
        server.answered.clear()
        command = [sys.executable, "-m", "selfrag.app.cli", "generate", *overrides(server.url, data, url, *extra)]
        process = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        # A part's file exists a moment before its bytes (file:// opens, then writes): wait for a whole line.
        while not (journal.is_dir() and any(b"\n" in part.read_bytes() for part in journal.iterdir())):
            assert time.monotonic() < deadline, "no journal part with a finished question within 60 s"
            time.sleep(0.005)
        process.kill()
        process.wait()
        journaled = sum(part.read_bytes().count(b"\n") for part in journal.iterdir())
        final = subprocess.run(command, env=env, capture_output=True, text=True)
        assert final.returncode == 0, final.stderr
        # only the calls in flight at the kill may be asked twice (and the unusable replies, which are never cached)
        assert len(server.usable_answered()) <= total + 2
    assert 0 < journaled < len(many)
    run = json.loads((tmp_path / "remote" / "run" / "run.json").read_text())
    assert run["questions_already_done"] >= journaled  # pulled from the URL, not labelled again
    files = joined_shards(url)
    for name in JSONL_OUTPUTS:
        assert files[name] == (tmp_path / "whole" / name).read_bytes(), name
    records = [json.loads(line) for line in files["records.jsonl"].splitlines()]
    assert len(records) == len({row["id"] for row in records}) == 12


def test_a_failed_final_upload_is_one_line_and_the_rerun_uploads(tmp_path: Path) -> None:
    import shutil

    from teacher_inputs import write_inputs

    data = write_inputs(tmp_path, QUERIES[:2])
    remote = tmp_path / "remote"
    with TeacherServer() as server:
        generate(server.url, data, f"file://{remote}")
        shutil.rmtree(remote / "shards")
        (remote / "shards").write_text("in the way")  # the storage refuses the shards folder
        with pytest.raises(InputError, match=r"the upload failed \(.*\); a local copy is in .*run the same command"):
            generate(server.url, data, f"file://{remote}")
        (remote / "shards").unlink()
        generate(server.url, data, f"file://{remote}")
    assert set(joined_shards(f"file://{remote}")) == set(JSONL_OUTPUTS)


def test_many_journal_parts_are_joined_into_one_when_pulled(tmp_path: Path, memory_url: str) -> None:
    from selfrag.data_gen.url_output import COMPACT_AFTER, UrlOutput

    fs, root = fsspec.core.url_to_fs(memory_url)
    lines = [json.dumps({"query_id": f"q{n % 50}", "n": n}) + "\n" for n in range(COMPACT_AFTER + 6)]
    for n, line in enumerate(lines):
        data = line + ('{"query_id": "cut' if n == 3 else "")  # one part cut mid-line by a killed upload
        fs.pipe_file(f"{root}/journal/{n:08d}.jsonl", data.encode())
    output = UrlOutput(memory_url, tmp_path / "staging", 10.0)
    output.pull()
    assert (tmp_path / "staging" / "journal.jsonl").read_text() == "".join(lines)
    assert fs.ls(f"{root}/journal", detail=False) == [f"{root}/journal/{len(lines):08d}.jsonl"]
    assert fs.cat_file(f"{root}/journal/{len(lines):08d}.jsonl").decode() == "".join(lines)
    output.finish(False, 10)
