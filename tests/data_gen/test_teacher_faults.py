"""A teacher run never fails silently: unreachable servers, unusable replies, edited inputs, exit codes.

Each test drives the real ``selfrag generate`` (in process, or its CLI entry) against a real HTTP server on
loopback whose replies are a function of the request only, as a greedy (temperature 0) model's are.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from teacher_inputs import write_inputs
from teacher_server import TeacherServer, field, item_of, scripted_label, scripted_reply
from test_teacher_run import QUERIES, generate, overrides, rows

from selfrag.app.cli import main
from selfrag.config import load_config
from selfrag.data_gen.config import GenerateConfig
from selfrag.data_gen.labelers import INSTRUCTIONS
from selfrag.data_gen.run import run
from selfrag.errors import ConfigError

PLAIN = QUERIES[:3]  # no fault markers: every question is labelled by the scripted teacher


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, Path]:
    return write_inputs(tmp_path, PLAIN)


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def kind_of(messages: list[dict[str, str]]) -> str | None:
    prompt = next(message["content"] for message in messages if message["role"] == "user")
    return next((kind for kind, text in INSTRUCTIONS.items() if prompt.startswith(text)), None)


def corrected(messages: list[dict[str, str]]) -> bool:
    return any(message["role"] == "assistant" for message in messages)


# --- the teacher unreachable --------------------------------------------------------------------------------


def test_wrong_base_url_warns_at_once_and_stops_in_seconds(
    data: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = closed_port_url()
    started = time.monotonic()
    # the default retries and back-off (5 retries a call, 1 s doubling): before, ~50 s of silence, then exit 0
    settings = ["labeler=llm", "teacher.model=m", f"teacher.engine_options.base_url={url}", "split=all"]
    paths = [f"passages={data[0]}", f"queries={data[1]}", f"output={tmp_path / 'out'}"]
    with caplog.at_level(logging.WARNING), pytest.raises(ConfigError) as error:
        run(load_config(GenerateConfig, None, [*settings, *paths]))
    assert time.monotonic() - started < 10
    message = str(error.value)
    assert f"{url}/chat/completions is unreachable" in message and "Connect" in message
    assert "teacher.engine_options.base_url" in message and "0 of 3 questions are finished" in message
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any(url in warning and "not reachable" in warning for warning in warnings), warnings


def test_server_killed_mid_run_stops_early_keeps_finished_and_resumes(data: tuple[Path, Path], tmp_path: Path) -> None:
    many = [dict(q, id=f"{q['id']}-{n}", question=f"{q['question']} (variant {n})") for n in range(8) for q in PLAIN]
    data[1].write_text("".join(json.dumps(row) + "\n" for row in many))
    script = Path(__file__).with_name("teacher_server.py")
    server = subprocess.Popen([sys.executable, str(script), "0.02"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        journal = tmp_path / "out" / "journal.jsonl"

        def kill_when_some_are_done() -> None:
            while not journal.exists() or len(journal.read_text().splitlines()) < 3:
                time.sleep(0.005)
            server.kill()  # SIGKILL: open connections reset, new ones refused

        killer = threading.Thread(target=kill_when_some_are_done, daemon=True)
        killer.start()
        started = time.monotonic()
        # refused at once, or (on a machine busy enough that the refusal comes after teacher.engine_options.timeout)
        # timed out
        with pytest.raises(ConfigError, match=r"unreachable: connection (error \(Connect|timeout after)"):
            generate(url, data, tmp_path / "out", "teacher.engine_options.concurrency=2",
                     "teacher.engine_options.backoff=0.5")
        assert time.monotonic() - started < 20
    finally:
        server.kill()
        server.wait()
    finished = len(rows(journal))
    assert 0 < finished < len(many)
    with TeacherServer() as again:  # a new server (another port): base_url is not a content setting
        result = generate(again.url, data, tmp_path / "out")
    assert result.stats["run"]["questions_already_done"] == finished and not result.problems
    assert result.stats["questions_labelled"] == len(many)


def test_failed_questions_exit_non_zero_saying_how_many_and_how_to_retry(
    data: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with TeacherServer() as server:
        answer = server.handle

        def handle(handler, body) -> None:  # type: ignore[no-untyped-def]
            if "poem" in json.dumps(body["messages"]):  # one question's calls always fail with a 503
                server._send(handler, 503, {"error": "overloaded"}, {}, "503")
            else:
                answer(handler, body)

        server.handle = handle  # type: ignore[method-assign]
        retries = "teacher.engine_options.max_retries=1"
        code = main(["generate", *overrides(server.url, data, tmp_path / "out", retries)])
    err = capsys.readouterr().err
    assert code == 1
    assert "1 of 3 questions failed on the teacher" in err and "HTTP 503" in err
    assert "run the same command again to retry them" in err
    with TeacherServer() as server:
        assert main(["generate", *overrides(server.url, data, tmp_path / "out")]) == 0


# --- unusable replies --------------------------------------------------------------------------------------


def test_every_label_dropped_exits_non_zero_and_a_repeated_reply_is_not_paid_again(
    data: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with TeacherServer(reply=lambda messages, seed: "I would say it is relevant.") as server:
        code = main(["generate", *overrides(server.url, data, tmp_path / "out")])
        requests = [json.dumps([body["messages"], body["temperature"]], sort_keys=True) for body in server.answered]
    err = capsys.readouterr().err
    assert code == 1 and "no record written: all 3 questions were dropped" in err and "teacher.model" in err
    assert rows(tmp_path / "out" / "records.jsonl") == []
    # each label: the prompt, then one correction; the same answer again ends it (not 3 identical greedy calls)
    assert max(Counter(requests).values()) == 1
    assert len(requests) == 3 * 2 + 1  # 3 retrieve decisions x (prompt, correction) + q3's answer written


def test_a_malformed_reply_is_corrected_not_asked_again_unchanged(data: tuple[Path, Path], tmp_path: Path) -> None:
    def greedy(messages: list[dict[str, str]], seed: int) -> str:
        """Malformed for every fresh prompt, whatever the seed; right once it reads a correction."""
        if kind_of(messages) is not None and not corrected(messages):
            return "Let me think about it."
        return scripted_reply(messages, seed)

    with TeacherServer(reply=greedy) as server:
        result = generate(server.url, data, tmp_path / "out", "label_retries=1")
        requests = [json.dumps([body["messages"], body["temperature"]], sort_keys=True) for body in server.answered]
    assert result.stats["questions_labelled"] == 3 and not result.stats["drops"]
    assert max(Counter(requests).values()) == 1
    corrections = [json.loads(request)[0] for request in requests if '"assistant"' in request]
    assert corrections and all(
        messages[-1]["content"].startswith("That reply cannot be used: reply is not JSON.") for messages in corrections
    )


def test_a_bare_label_without_json_is_accepted(data: tuple[Path, Path], tmp_path: Path) -> None:
    def bare(messages: list[dict[str, str]], seed: int) -> str:
        kind = kind_of(messages)
        return scripted_reply(messages, seed) if kind is None else scripted_label(kind, messages[-1]["content"])

    with TeacherServer() as server:
        generate(server.url, data, tmp_path / "json")
    with TeacherServer(reply=bare) as server:  # its own cache: the first run's answers would be replayed
        result = generate(server.url, data, tmp_path / "bare", f"teacher.cache={tmp_path / 'bare.sqlite'}")
        calls = len(server.answered)
    assert not result.stats["drops"] and calls == result.stats["teacher"]["calls"]
    assert (tmp_path / "bare" / "records.jsonl").read_text() == (tmp_path / "json" / "records.jsonl").read_text()


def test_a_dropped_relevance_label_never_turns_the_evidence_into_irrelevant(
    data: tuple[Path, Path], tmp_path: Path
) -> None:
    def lost(messages: list[dict[str, str]], seed: int) -> str:
        """The one relevant passage of q1 gets a malformed relevance reply; everything else is answered."""
        item = item_of(messages[-1]["content"])
        if kind_of(messages) == "relevance" and "France" in field(item, "Instruction") and "Seine" in item:
            return "hmm"
        return scripted_reply(messages, seed)

    with TeacherServer(reply=lost) as server:
        result = generate(server.url, data, tmp_path / "out", "label_retries=0")
    records = {row["meta"]["query_id"]: row for row in rows(tmp_path / "out" / "records.jsonl")}
    assert "q1" not in records  # not kept as "[Irrelevant] + a support verdict" about another passage
    reasons = [row["reason"] for row in rows(tmp_path / "out" / "drops.jsonl") if row["query_id"] == "q1"]
    assert "relevance: a candidate's label was dropped and no labelled candidate is relevant" in reasons
    assert result.stats["questions_labelled"] == 2
    for row in records.values():  # every label in a kept record is one the teacher gave
        for segment in row["segments"]:
            assert all(segment[slot] is None or segment[slot]["labeler"] == "llm" for slot in ("relevance", "support"))


def test_a_rerun_against_a_fixed_teacher_asks_again_what_failed_and_restart_starts_over(
    data: tuple[Path, Path], tmp_path: Path
) -> None:
    """Before: the unusable replies were cached, so the rerun against the fixed teacher made 0 calls and failed the
    same way, even with label_retries=3 restart=true; and restart=true with the same settings quietly resumed."""

    def broken(messages: list[dict[str, str]], seed: int) -> str:
        """A teacher (or its server's chat template) that answers every relevance prompt outside the vocabulary."""
        return '{"label": "[Maybe]"}' if kind_of(messages) == "relevance" else scripted_reply(messages, seed)

    out = tmp_path / "out"
    with TeacherServer(reply=broken) as server:
        first = generate(server.url, data, out)
        usable = {key for key, body in zip(server.answered_keys(), server.answered, strict=True)
                  if kind_of(body["messages"]) != "relevance"}
    assert first.stats["questions_labelled"] < 3 and first.stats["drops"] and usable
    with TeacherServer() as fixed:  # the same model name, fixed
        resumed = generate(fixed.url, data, out)  # a plain rerun keeps the finished (dropped) questions
        assert resumed.stats["run"]["questions_already_done"] == 3 and not fixed.answered
        restarted = generate(fixed.url, data, out, "restart=true")  # the same settings: starts over all the same
        asked = fixed.answered_keys()
        relevance = [body for body in fixed.answered if kind_of(body["messages"]) == "relevance"]
    assert restarted.stats["run"]["questions_already_done"] == 0
    assert restarted.stats["questions_labelled"] == 3 and not restarted.stats["drops"]
    # what failed went to the teacher again (and the steps after it); no usable reply was paid twice
    assert relevance and not set(asked) & usable and restarted.stats["run"]["teacher_calls_from_cache"] > 0
    with TeacherServer(reply=broken) as server:  # and with label_retries=3 restart=true, as the user tried
        generate(server.url, data, tmp_path / "again", "teacher.cache=" + str(tmp_path / "own.sqlite"))
    with TeacherServer() as fixed:
        retried = generate(fixed.url, data, tmp_path / "again", "teacher.cache=" + str(tmp_path / "own.sqlite"),
                           "label_retries=3", "restart=true")
    assert retried.stats["run"]["teacher_calls_made"] > 0 and retried.stats["questions_labelled"] == 3


# --- inputs edited in place ---------------------------------------------------------------------------------


def test_an_edited_corpus_is_refused_and_an_edited_question_is_labelled_again(
    data: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with TeacherServer() as server:
        generate(server.url, data, out)
        corpus = data[0].read_text().replace("It lies on the Seine.", "It lies on the Loire.")
        data[0].write_text(corpus)
        with pytest.raises(ConfigError, match=r"passages: content changed \(.*restart=true"):
            generate(server.url, data, out)
        restarted = generate(server.url, data, out, "restart=true")
        assert restarted.stats["run"]["questions_already_done"] == 0
        assert "Loire" in (out / "records.jsonl").read_text()
        # a run from before selfrag.sentences (no splitter recorded) split the teacher's answers another way
        # (today's fingerprint.json gone: config.yaml and an inputs.json that names no splitter, as such a run left)
        corpus_digest = json.loads((out / "fingerprint.json").read_text())["inputs"]["passages"]
        (out / "fingerprint.json").unlink()
        (out / "inputs.json").write_text(json.dumps({"corpus": corpus_digest}))
        with pytest.raises(ConfigError, match=r"without fingerprint.json \(an older selfrag's.*set restart=true"):
            generate(server.url, data, out)
        generate(server.url, data, out, "restart=true")
        edited = [dict(PLAIN[0], question="What is the capital city of France?"), *PLAIN[1:]]
        data[1].write_text("".join(json.dumps(row) + "\n" for row in edited))
        before = len(server.answered)
        again = generate(server.url, data, out)
        asked = {field(item_of(body["messages"][-1]["content"]), "Instruction") for body in server.answered[before:]}
    assert again.stats["run"]["questions_changed"] == 1 and again.stats["run"]["questions_already_done"] == 2
    assert again.stats["run"]["questions_changed_ids"] == [PLAIN[0]["id"]]
    assert asked == {"What is the capital city of France?"}  # only the edited question went to the teacher
    instructions = {row["instruction"] for row in rows(out / "records.jsonl")}
    assert "What is the capital city of France?" in instructions
    assert "What is the capital of France?" not in instructions


# --- generate-merge ----------------------------------------------------------------------------------------


def test_merge_refuses_a_non_empty_output(data: tuple[Path, Path], tmp_path: Path) -> None:
    with TeacherServer() as server:
        generate(server.url, data, tmp_path / "shard-0")
    target = tmp_path / "merged"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    code = main(["generate-merge", f"shards=[{tmp_path / 'shard-0'}]", f"output={target}"])
    assert code == 2 and (target / "notes.txt").read_text() == "mine"
    assert sorted(path.name for path in target.iterdir()) == ["notes.txt"]
