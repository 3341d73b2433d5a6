"""The audit page in headless Chromium over a real `selfrag generate` run of the demo data: three verdicts by
keyboard are saved beside the run, a reload continues where it stopped, and the report's kappa matches a hand
computation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import screenshot, start_chrome, wait_for

from selfrag import reflection as rf
from selfrag.config import load_config
from selfrag.data_gen.audit import Audit
from selfrag.data_gen.audit_server import AuditServer
from selfrag.data_gen.config import GenerateConfig
from selfrag.data_gen.run import run as generate

REPO = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("audit") / "data"
    generate(load_config(GenerateConfig, REPO / "configs/data_gen/squad-demo.yaml", [f"output={out}", "limit=6"]))
    return out


@pytest.fixture
def served(demo_run: Path) -> Iterator[AuditServer]:
    server = AuditServer(Audit(demo_run, per_stratum=2, seed=0)).start()
    yield server
    server.stop()


def _progress(driver: Any) -> str:
    return str(driver.find_element("id", "progress").text)


def test_three_verdicts_by_keyboard_and_the_report_kappa(served: AuditServer) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    sample = served.audit.sample
    relevance = [index for index, item in enumerate(sample) if item.type == "relevance"]
    relevant = next(i for i in relevance if sample[i].teacher == rf.RELEVANT)
    irrelevant = [i for i in relevance if sample[i].teacher == rf.IRRELEVANT][:2]
    # the reviewer: agrees on the [Relevant] one, calls the first [Irrelevant] one relevant, agrees on the second
    plan = sorted([(relevant, "1"), (irrelevant[0], "1"), (irrelevant[1], "2")])
    driver = start_chrome()
    try:
        driver.get(served.url)
        wait_for(driver, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "true")
        total = len(sample)
        assert _progress(driver) == f"0 / {total} reviewed"
        position = 0
        for done, (index, key) in enumerate(plan, start=1):
            keys = ActionChains(driver)
            for _ in range(index - position):
                keys.send_keys(Keys.ARROW_RIGHT)
            keys.perform()
            wait_for(driver, lambda d, i=index: d.find_element("id", "record-id").text == sample[i].id)
            assert driver.find_element("id", "teacher").text == sample[index].teacher
            if done == len(plan):
                screenshot(driver, "audit.png")  # a relevance label with its passage, two verdicts in
            ActionChains(driver).send_keys(key).perform()
            wait_for(driver, lambda d, n=done: _progress(d) == f"{n} / {total} reviewed")
            position = index + 1  # the page moves on to the next unreviewed record

        saved = [json.loads(line) for line in (served.audit.data_dir / "audit" / "verdicts.jsonl").read_text()
                 .splitlines()]
        assert sorted((v["id"], v["teacher"], v["human"]) for v in saved) == sorted(
            (sample[i].id, sample[i].teacher, rf.RELEVANT if key == "1" else rf.IRRELEVANT) for i, key in plan)

        # By hand: teacher R, I, I; reviewer R, R, I. Observed agreement 2/3. Teacher says R once and I twice,
        # the reviewer R twice and I once: chance agreement (1*2 + 2*1) / 9 = 4/9.
        # kappa = (2/3 - 4/9) / (1 - 4/9) = (2/9) / (5/9) = 0.4
        ActionChains(driver).send_keys("r").perform()
        row = wait_for(driver, lambda d: d.find_element("css selector", "#report-table tr[data-type='relevance']"))
        kappa = row.find_element("css selector", ".kappa")
        assert float(kappa.get_attribute("data-value")) == pytest.approx(0.4)
        assert kappa.text.startswith("0.40 [")
        assert "0.67" in row.text  # agreement 2/3
        wait_for(driver, lambda d: d.execute_script(
            "const plot = document.getElementById('report-plot'); return plot.complete && plot.naturalWidth > 0"))
        driver.execute_script("document.getElementById('report').scrollIntoView()")
        screenshot(driver, "audit-report.png")

        driver.refresh()  # reopening continues at the first unreviewed record
        wait_for(driver, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "true")
        assert _progress(driver) == f"3 / {total} reviewed"
        first_open = next(i for i in range(total) if i not in {index for index, _ in plan})
        assert driver.find_element("id", "record-id").text == sample[first_open].id
    finally:
        driver.quit()


def test_a_failed_save_is_a_message(served: AuditServer) -> None:
    driver = start_chrome()
    try:
        driver.get(served.url)
        wait_for(driver, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "true")
        served.stop()  # the server goes away under the page
        driver.find_element("css selector", "#choices button").click()
        wait_for(driver, lambda d: d.find_element("id", "message").is_displayed())
        assert driver.find_element("id", "message").text.startswith("The verdict was not saved: ")
    finally:
        driver.quit()
