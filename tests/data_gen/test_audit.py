"""The label audit: a seeded stratified sample, verdicts saved beside the run and resumed, the agreement report, and
one line for each bad input (not a run, an empty sample, a verdict whose record is gone)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from audit_runs import STRATA, write_run

from selfrag import reflection as rf
from selfrag.app.cli import main
from selfrag.data_gen.audit import Audit, AuditError, stratified_sample
from selfrag.data_gen.audit_report import agreement_report, write_report
from selfrag.data_gen.audit_server import AuditServer


def test_sample_takes_up_to_per_stratum_of_each_type_and_label_and_is_seeded(tmp_path: Path) -> None:
    audit = Audit(write_run(tmp_path / "run"), per_stratum=2, seed=5)
    counts = Counter((item.type, item.teacher) for item in audit.sample)
    assert counts == {(kind, label): min(2, count) for kind, label, count in STRATA}
    again = stratified_sample(audit.items.values(), 2, 5)
    assert [item.id for item in again] == [item.id for item in audit.sample]
    assert [item.id for item in stratified_sample(audit.items.values(), 2, 6)] != [item.id for item in again]


def test_verdicts_are_saved_beside_the_run_and_a_reopened_audit_continues(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    before = {path.name: path.read_bytes() for path in run.iterdir()}
    audit = Audit(run, per_stratum=3, seed=1)
    first, second = audit.sample[0], audit.sample[1]
    audit.record(first.id, first.choices[0])
    audit.record(second.id, second.choices[-1])
    audit.record(first.id, first.choices[1])  # a second verdict replaces the first
    lines = (run / "audit" / "verdicts.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["id"] for line in lines] == [first.id, second.id]
    assert {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()} == before  # records untouched

    reopened = Audit(run)  # the saved settings: same sample, verdicts so far
    assert [item.id for item in reopened.sample] == [item.id for item in audit.sample]
    state = reopened.state()
    assert [item["human"] for item in state["items"][:2]] == [first.choices[1], second.choices[-1]]
    assert all(item["human"] is None for item in state["items"][2:])


def test_a_label_of_another_type_or_a_record_outside_the_sample_is_refused(tmp_path: Path) -> None:
    audit = Audit(write_run(tmp_path / "run"), per_stratum=1)
    item = next(item for item in audit.sample if item.type == "relevance")
    with pytest.raises(AuditError, match="not a relevance label"):
        audit.record(item.id, rf.FULLY_SUPPORTED)
    outside = next(identifier for identifier in audit.items if identifier not in {i.id for i in audit.sample})
    with pytest.raises(AuditError, match="not in this audit's sample"):
        audit.record(outside, rf.RELEVANT)


def test_report_agreement_matches_a_hand_computation(tmp_path: Path) -> None:
    # relevance: teacher R R I I, human R I I R -> p_o = 1/2, p_e = (2*2 + 2*2)/16 = 1/2 -> kappa 0
    # retrieve: teacher Ret Ret NoRet, human Ret Ret NoRet -> kappa 1
    verdicts = [{"type": "relevance", "teacher": t, "human": h} for t, h in
                ((rf.RELEVANT, rf.RELEVANT), (rf.RELEVANT, rf.IRRELEVANT), (rf.IRRELEVANT, rf.IRRELEVANT),
                 (rf.IRRELEVANT, rf.RELEVANT))]
    verdicts += [{"type": "retrieve", "teacher": t, "human": t} for t in (rf.RETRIEVAL, rf.RETRIEVAL, rf.NO_RETRIEVAL)]
    report = agreement_report(verdicts, resamples=200)
    rows = {row["type"]: row for row in report["types"]}
    assert [row["type"] for row in report["types"]] == ["retrieve", "relevance"]  # the vocabulary's order
    assert rows["relevance"]["kappa"] == pytest.approx(0.0) and rows["relevance"]["accuracy"] == 0.5
    assert rows["relevance"]["labels"][rf.RELEVANT]["confirmed"] == 1
    assert rows["retrieve"]["kappa"] == pytest.approx(1.0)


def test_write_report_makes_the_table_the_json_and_the_plot(tmp_path: Path) -> None:
    audit = Audit(write_run(tmp_path / "run"), per_stratum=2)
    for item in audit.sample[:6]:
        audit.record(item.id, item.teacher)
    text, report = write_report(audit)
    assert "| type | reviewed | agreement | Cohen's kappa |" in text
    folder = tmp_path / "run" / "audit"
    assert json.loads((folder / "report.json").read_text())["types"] == json.loads(json.dumps(report["types"]))
    assert (folder / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_report_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run")
    audit = Audit(run, per_stratum=2)
    item = audit.sample[0]
    audit.record(item.id, item.teacher)
    assert main(["audit", str(run), "--report"]) == 0
    out = capsys.readouterr().out
    assert f"| {item.type} | 1 | 1.00" in out


@pytest.mark.parametrize("case", ["missing", "not_a_run", "empty", "gone", "stray", "relabelled", "seed",
                                  "no_verdicts"])
def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    run = tmp_path / "run"
    if case == "missing":
        expected = "not found"
    elif case == "not_a_run":
        run.mkdir()
        (run / "notes.txt").write_text("hello")
        expected = "is not a `selfrag generate` run"
    elif case == "empty":
        write_run(run, rows=[])
        expected = "no critic rows to audit"
    else:
        write_run(run)
        audit = Audit(run, per_stratum=2)
        item = audit.sample[0]
        audit.record(item.id, item.teacher)
        verdicts = run / "audit" / "verdicts.jsonl"
        if case == "gone":  # the run was regenerated without this record
            rows = [json.loads(line) for line in (run / "critic.jsonl").read_text().splitlines()]
            write_run(run, [row for row in rows if row["id"] != item.id])
            expected = "audit.json: the audit's sample holds record .* no longer in the run's critic files"
        elif case == "stray":  # a verdict line for a record the run never had
            stray = {"id": "q-none", "type": "retrieve", "teacher": rf.RETRIEVAL, "human": rf.RETRIEVAL}
            verdicts.write_text(verdicts.read_text() + json.dumps(stray) + "\n")
            expected = "verdicts.jsonl:2: a verdict for record 'q-none', which is no longer in the run"
        elif case == "relabelled":
            row = json.loads(verdicts.read_text())
            verdicts.write_text(json.dumps({**row, "teacher": "[Utility:3]"}) + "\n")
            expected = "was reviewed against teacher label"
        elif case == "seed":
            expected = "started with seed=0, got seed=4"
        else:
            verdicts.unlink()
            expected = "no verdicts yet"
    argv = ["audit", str(run), "--report"] + (["--seed", "4"] if case == "seed" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert re.search(expected, err), err


def test_a_run_that_grew_keeps_the_audits_sample(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    audit = Audit(run, per_stratum=1)
    audit.record(audit.sample[0].id, audit.sample[0].teacher)
    rows = [json.loads(line) for line in (run / "critic.jsonl").read_text().splitlines()]
    extra = [{**row, "id": row["id"].replace("q-", "z-")} for row in rows]  # more questions, labelled since
    write_run(run, rows + extra)
    assert [item.id for item in Audit(run).sample] == [item.id for item in audit.sample]


def test_a_damaged_settings_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run")
    (run / "audit").mkdir()
    (run / "audit" / "audit.json").write_text("{not json")
    assert main(["audit", str(run), "--report"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "audit.json is not valid JSON" in err


def test_cli_serves_the_page_on_loopback_until_interrupted(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    command = [sys.executable, "-m", "selfrag.app.cli", "audit", str(run), "--port", "0"]
    # SIGINT at its default in the child: a suite launched in the background (`cmd &` without job control ignores
    # SIGINT) would hand the ignore down, and the page would never hear the Ctrl-C this test sends
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = process.stdout.readline() if process.stdout else ""
        url = re.search(r"open (http://127\.0\.0\.1:\d+/)", line)
        assert url, line
        state = json.loads(urllib.request.urlopen(url.group(1) + "api/state", timeout=10).read())
        assert len(state["items"]) == sum(min(10, count) for _, _, count in STRATA)
        page = urllib.request.urlopen(url.group(1), timeout=10).read().decode()
        assert "<title>selfrag label audit</title>" in page
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    assert process.returncode == 0 and "stopped; run the same command to continue" in out, err


def test_the_api_answers_a_bad_verdict_with_a_message(tmp_path: Path) -> None:
    server = AuditServer(Audit(write_run(tmp_path / "run"), per_stratum=1)).start()
    try:
        item = server.audit.sample[0]

        def post(body: bytes, kind: str = "application/json") -> tuple[int, dict[str, object]]:
            request = urllib.request.Request(server.url + "api/verdict", body, {"Content-Type": kind})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as error:
                return error.code, json.loads(error.read())

        status, body = post(json.dumps({"id": "q-gone/critic-000", "human": rf.RELEVANT}).encode())
        assert status == 400 and "is not in" in str(body["error"])
        status, body = post(json.dumps({"id": item.id, "human": "[Maybe]"}).encode())
        assert status == 400 and f"is not a {item.type} label" in str(body["error"])
        assert post(b"id=1", "application/x-www-form-urlencoded")[0] == 415  # a cross-site form cannot post
        assert post(b"{not json")[0] == 400
        status, body = post(json.dumps({"id": item.id, "human": item.teacher}).encode())
        assert status == 200 and body["reviewed"] == 1
    finally:
        server.stop()


def test_the_page_links_an_icon_and_a_browser_asking_for_favicon_ico_gets_it(tmp_path: Path) -> None:
    server = AuditServer(Audit(write_run(tmp_path / "run"), per_stratum=1)).start()
    try:
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert '<link rel="icon" href="/favicon.svg"' in response.read().decode()
        for path in ("favicon.svg", "favicon.ico"):  # was 404 (issue 44)
            with urllib.request.urlopen(server.url + path, timeout=10) as response:
                assert response.status == 200 and response.headers["Content-Type"] == "image/svg+xml"
                assert response.read().startswith(b"<svg")
    finally:
        server.stop()
