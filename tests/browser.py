"""Headless Chromium for the pages' tests: Debian's ``chromium`` driven by Selenium through the system
``/usr/bin/chromedriver`` (both installed by scripts/setup.sh); Selenium Manager never runs (it would download).

A test that cannot start the browser is skipped with the reason; any other failure is a failure.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

CHROMEDRIVER = Path("/usr/bin/chromedriver")


def start_chrome(width: int = 1280, height: int = 900) -> Any:
    """A headless Chrome session; skips the calling test when chromium or its driver cannot start."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (scripts/setup.sh)")
    from selenium.common.exceptions import WebDriverException

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None or not CHROMEDRIVER.is_file():
        pytest.skip("chromium cannot start: chromium or /usr/bin/chromedriver is not installed (scripts/setup.sh "
                    "installs them: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     f"--window-size={width},{height}", "--disable-extensions", "--no-first-run"):
        options.add_argument(argument)
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER))
    try:
        return webdriver.Chrome(options=options, service=service)
    except WebDriverException as error:
        pytest.skip(f"chromium cannot start: {str(error.msg or error).splitlines()[0]}")


def wait_for(driver: Any, condition: Any, timeout: float = 15.0) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition)


def screenshot(driver: Any, name: str) -> None:
    """Save a PNG of the page when SELFRAG_SCREENSHOTS names a folder (how docs/images/ is made)."""
    folder = os.environ.get("SELFRAG_SCREENSHOTS")
    if folder:
        from PIL import Image  # matplotlib's dependency

        path = Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(path))
        with Image.open(path) as image:  # a 256-colour palette: a third of the bytes, the same look for a UI
            small = image.convert("RGB").quantize(colors=256)
        small.save(path, optimize=True)
