"""The trace inspector at ``/`` in headless Chromium: it streams an answer from the served scripted model and lays
out its decisions (retrieve probability against the threshold, passages with relevance scores and verdicts, support
and utility, citations linked to their sentences, abstention with its reason); server errors are messages."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser import screenshot, start_chrome, wait_for
from server_harness import (
    CAPITAL,
    CAPITAL_ANSWER,
    MAYOR,
    MAYOR_ANSWER,
    LiveServer,
    ScriptedBackendEngine,
    serving,
)

from selfrag import reflection as rf
from selfrag.inference.config import InferenceConfig, PruningConfig

KEY = "sk-page-test"
REPO = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def engine(reflection_tokenizer: Any, token_ids: Any) -> ScriptedBackendEngine:
    return ScriptedBackendEngine(reflection_tokenizer, token_ids)


@pytest.fixture(scope="module")
def server(engine: ScriptedBackendEngine) -> Iterator[LiveServer]:
    with serving(engine, api_key=KEY) as live:
        yield live


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    browser = start_chrome()
    yield browser
    browser.quit()


def test_the_page_is_served_without_a_key_and_shipped_as_package_data(server: LiveServer) -> None:
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for name, kind in (("inspector.js", "javascript"), ("inspector.css", "text/css")):
        response = httpx.get(f"{server.url}/static/{name}")
        assert response.status_code == 200 and kind in response.headers["content-type"]
    assert "//" not in page.text.replace("<!doctype", "")  # no CDN: every URL is relative to the server
    assert "/" not in httpx.get(server.url + "/openapi.json").json()["paths"]
    assert httpx.get(server.url + "/v1/models").status_code == 401  # the API itself still wants the key
    shipped = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "static/*" in shipped["selfrag.inference.server"]
    assert "audit_page/*" in shipped["selfrag.data_gen"]


def _page(driver: Any, server: LiveServer, key: str = KEY) -> None:
    driver.get(server.url + "/")
    wait_for(driver, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "true")
    field = driver.find_element("id", "api-key")
    field.clear()
    field.send_keys(key)
    field.send_keys("\t")  # change event: kept in sessionStorage, models reloaded with the key


def _ask(driver: Any, question: str) -> None:
    box = driver.find_element("id", "question")
    box.clear()
    box.send_keys(question)
    driver.find_element("id", "send").click()


def _state(driver: Any) -> str | None:
    return driver.find_element("tag name", "body").get_attribute("data-state")


def test_the_inspector_streams_an_answer_and_lays_out_its_decisions(driver: Any, server: LiveServer,
                                                                    engine: ScriptedBackendEngine) -> None:
    _page(driver, server)
    wait_for(driver, lambda d: d.find_element("id", "model").get_attribute("value") == "selfrag-test")
    engine.gate.clear()  # hold the model: the page must show a stream in progress, not a blank wait
    try:
        _ask(driver, CAPITAL)
        wait_for(driver, lambda d: _state(d) == "streaming" and engine.entered.is_set())
        assert driver.find_element("id", "status").text == "streaming…"
        assert driver.find_element("id", "stop").is_enabled()
    finally:
        engine.gate.set()
    wait_for(driver, lambda d: _state(d) == "done")
    assert driver.find_element("id", "answer").text.startswith(CAPITAL_ANSWER)
    assert KEY not in driver.current_url
    assert driver.execute_script("return sessionStorage.getItem('selfrag.apiKey')") == KEY

    decide = driver.find_element("css selector", "#decide .decide")
    assert decide.get_attribute("data-chosen") == "retrieve"
    assert "p(retrieve) = 0.900" in decide.text and "threshold 0.20" in decide.text

    rows = {row.get_attribute("data-passage"): row.text
            for row in driver.find_elements("css selector", "#rounds tr.passage-row")}
    assert set(rows) == {"p-paris", "p-lyon", "p-nice"}
    assert "0.950" in rows["p-paris"] and rf.RELEVANT in rows["p-paris"] and rf.FULLY_SUPPORTED in rows["p-paris"]
    assert "0.300" in rows["p-lyon"] and rf.IRRELEVANT in rows["p-lyon"] and "[Utility:5]" in rows["p-lyon"]
    assert "Paris (p-paris)" in rows["p-paris"]  # the cited passage's title
    chosen = driver.find_elements("css selector", "#rounds tr.chosen")
    assert [row.get_attribute("data-passage") for row in chosen] == ["p-paris"]
    assert "accept" in driver.find_element("css selector", "#rounds .support-step").text

    # the sentence links to the passage it came from, and the passage lists the sentences it supports
    link = driver.find_element("css selector", "#answer .segment[data-passage='p-paris'] sup a")
    assert link.text == "[1]" and link.get_attribute("href").endswith("#cite-1")
    card = driver.find_element("id", "cite-1")
    assert "Paris is the capital of France." in card.text and "supports" in card.text.lower()
    flags = driver.find_element("id", "flags").text
    assert "retrieved" in flags and "confident" in flags
    steps = [item.get_attribute("data-step") for item in driver.find_elements("css selector", "#steps li")]
    assert steps[:3] == ["decide", "retrieve", "relevance"]
    screenshot(driver, "inspector.png")


def test_a_re_retrieval_round_and_an_abstention_with_its_reason(driver: Any, engine: ScriptedBackendEngine) -> None:
    rounds = InferenceConfig(max_rounds=1, pruning=PruningConfig(enabled=False))
    with serving(engine, api_key=KEY, inference=rounds) as server:
        _page(driver, server)
        _ask(driver, MAYOR)
        wait_for(driver, lambda d: _state(d) == "done")
        flag = driver.find_element("id", "abstained").text
        assert flag.startswith("abstained: ") and rf.NO_SUPPORT in flag
        assert driver.find_element("css selector", "#citations .empty").text == "No citations."
        blocks = driver.find_elements("css selector", "#rounds .round")
        assert [block.get_attribute("data-round") for block in blocks] == ["0", "1"]
        assert "re-retrieve" in blocks[0].text  # round 1's support verdict sent the runtime back to retrieval
        assert "Round 2" in blocks[1].text and "No passage:" in blocks[1].text


def test_the_icon_is_served_and_the_page_files_count_under_their_route(server: LiveServer) -> None:
    page = httpx.get(server.url + "/").text
    assert '<link rel="icon" href="static/favicon.svg"' in page
    for path in ("/favicon.ico", "/static/favicon.svg"):  # favicon.ico was 404 (issue 44)
        icon = httpx.get(server.url + path)
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml", path
        assert icon.text.startswith("<svg")
    assert httpx.get(server.url + "/static/inspector.js").status_code == 200
    metrics = httpx.get(server.url + "/metrics").text
    assert 'selfrag_requests_total{route="/static",status="200"}' in metrics  # was counted as unmatched
    assert 'selfrag_requests_total{route="/favicon.ico",status="200"}' in metrics
    assert 'route="unmatched",status="200"' not in metrics


def test_a_re_retrieval_round_shows_its_own_query(driver: Any, engine: ScriptedBackendEngine) -> None:
    with serving(engine, api_key=KEY, inference=InferenceConfig(max_rounds=1)) as server:
        _page(driver, server)
        driver.find_element("id", "top-k").send_keys("1")  # round 2 then finds a passage not tried yet
        _ask(driver, MAYOR)
        wait_for(driver, lambda d: _state(d) == "done")
        blocks = driver.find_elements("css selector", "#rounds .round")
        assert [block.get_attribute("data-round") for block in blocks] == ["0", "1"]
        queries = [block.find_element("css selector", "[data-query]").text for block in blocks]
        assert queries == [f"· query: {MAYOR}", f"· query: {MAYOR} {MAYOR_ANSWER}"], queries
        assert [row.get_attribute("data-passage") for row in blocks[1].find_elements("css selector", "tr")[1:]] == [
            "p-lyon"]
        # long form: every segment has its rounds; a segment's round is not merged into another segment's (one
        # block whose query was the last segment's)
        trace = [{"step": "retrieve", "segment": 0, "round": 0, "query": "q", "chosen": ["a"]},
                 {"step": "support", "segment": 0, "round": 0, "chosen": "re-retrieve", "query": "q one"},
                 {"step": "retrieve", "segment": 0, "round": 1, "query": "q one", "chosen": ["b"]},
                 {"step": "retrieve", "segment": 1, "round": 0, "query": "q one two", "chosen": ["c"]}]
        laid_out = driver.execute_script("return [...rounds(arguments[0]).values()]"
                                         ".map((r) => [r.segment, r.number, r.query, [...r.passages.keys()]])", trace)
        assert laid_out == [[0, 0, "q", ["a"]], [0, 1, "q one", ["b"]], [1, 0, "q one two", ["c"]]]


def test_a_relevant_passage_without_a_support_verdict_says_why(driver: Any, engine: ScriptedBackendEngine) -> None:
    # Lyon's relevance 0.3 is [Relevant] at 0.25, and more than the margin (0.5) behind Paris's 0.95: pruned
    with serving(engine, api_key=KEY, inference=InferenceConfig(max_rounds=0, relevance_threshold=0.25)) as server:
        _page(driver, server)
        _ask(driver, CAPITAL)
        wait_for(driver, lambda d: _state(d) == "done")
        row = driver.find_element("css selector", "#rounds tr[data-passage='p-lyon']")
        assert rf.RELEVANT in row.text and rf.IRRELEVANT not in row.text
        why = row.find_element("css selector", "td.support .why").text
        assert why.startswith("not scored: stopped after its relevance token") and "behind the best" in why, why
        paris = driver.find_element("css selector", "#rounds tr[data-passage='p-paris']")
        assert rf.FULLY_SUPPORTED in paris.text and not paris.find_elements("css selector", ".why")


def test_server_errors_are_messages_not_a_blank_page(driver: Any, server: LiveServer) -> None:
    _page(driver, server, key="wrong-key")
    wait_for(driver, lambda d: d.find_element("id", "message").is_displayed())
    assert "401" in driver.find_element("id", "message").text  # from GET /v1/models
    _ask(driver, CAPITAL)
    wait_for(driver, lambda d: _state(d) == "failed")
    text = driver.find_element("id", "message").text
    assert text.startswith("The server answered 401: missing or wrong API key"), text


def test_an_error_in_the_middle_of_the_stream_is_a_message(driver: Any, engine: ScriptedBackendEngine) -> None:
    with serving(engine, api_key=KEY, timeout_s=0.5) as server:
        engine.gate.clear()  # the model never answers: the server sends its timeout error inside the stream
        _page(driver, server)
        _ask(driver, CAPITAL)
        wait_for(driver, lambda d: _state(d) == "failed")
        text = driver.find_element("id", "message").text
        assert text.startswith("The server reported an error: no answer within timeout_s=0.5"), text
        assert driver.find_element("id", "status").text == "failed"
