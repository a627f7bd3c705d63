"""The UI as a user meets it in the browser tests: Dagster's webserver serving the real code location of
``workspace.yaml`` over a test's instance, and a headless Chromium on it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from resources.spark import port_open
from tests.support.dev_stack import ROOT, free_port, kill_stragglers

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# a page of the UI on a loaded 2-core machine: its GraphQL queries wait behind the runs' Spark work
PAGE_S = 180
REPOSITORY = "__repository__@warehouse"  # the code location of workspace.yaml, as the UI's URLs name it
MISSING = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
needs_browser = pytest.mark.skipif(
    bool(MISSING),
    reason=f"not installed: {', '.join(MISSING)} (`make system-packages` installs Debian's chromium and "
    "chromium-driver when run as root)",
)
# runs launched by the webserver go straight to a process of their own (no daemon, no queue)
INSTANCE = """storage:
  sqlite:
    base_dir: {home}
telemetry:
  enabled: false
run_coordinator:
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
"""


def sqlite_home(root: Path) -> Path:
    """A Dagster home under ``root`` whose instance keeps everything in SQLite and launches runs at once."""
    home = root / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(INSTANCE.format(home=home))
    return home


@contextmanager
def webserver(root: Path, home: Path) -> Iterator[str]:
    """Dagster's webserver on ``home``'s instance and the lake and landing area under ``root``; its URL."""
    env = dict(
        os.environ,
        DAGSTER_HOME=str(home),
        WAREHOUSE_LAKE_ROOT=str(root / "lake"),
        WAREHOUSE_LANDING_ROOT=str(root / "landing"),
    )
    port = free_port()
    log = (root / "webserver.log").open("wb")
    proc = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        WebDriverWait(None, PAGE_S, poll_frequency=1).until(
            lambda _: proc.poll() is not None or port_open("127.0.0.1", port)
        )
        assert proc.poll() is None, (root / "webserver.log").read_text()[-3000:]
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kill_stragglers(f"DAGSTER_HOME={home}")
        log.close()


@contextmanager
def chromium(url: str) -> Iterator[WebDriver]:
    """Headless Chromium on ``url``'s origin, the community pop-up of a fresh profile dismissed."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    # no sandbox: CI runs as root, where Chromium's sandbox refuses to start
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1300"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        driver.get(f"{url}/health")
        driver.execute_script("localStorage.setItem('communityNux', JSON.stringify('1'))")
        yield driver
    finally:
        driver.quit()  # Chromium and chromedriver with it


def shoot(driver: WebDriver, screenshots: Path, name: str) -> Path:
    path = screenshots / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    print(f"screenshot: {path}")
    return path


def page_text(driver: WebDriver) -> str:
    return driver.find_element(By.TAG_NAME, "body").text


def wait_for_text(driver: WebDriver, pattern: str, timeout: float = PAGE_S) -> re.Match[str]:
    """Wait until the page's visible text matches ``pattern`` (a regular expression); the match."""
    found: list[re.Match[str]] = []

    def matches(d: WebDriver) -> bool:
        try:
            match = re.search(pattern, page_text(d))
        except WebDriverException:  # the page re-rendered under us
            return False
        found[:] = [match] if match else []
        return bool(match)

    try:
        WebDriverWait(driver, timeout, poll_frequency=1).until(matches)
    except Exception:
        pytest.fail(f"no text matching {pattern!r} on {driver.current_url} after {timeout}s:\n{page_text(driver)}")
    return found[0]


def clickable(driver: WebDriver, xpath: str, timeout: float = PAGE_S) -> WebElement:
    return WebDriverWait(driver, timeout, poll_frequency=1).until(
        expected_conditions.element_to_be_clickable((By.XPATH, xpath))
    )


def button(label: str) -> str:
    return f"//button[normalize-space(.)='{label}']"
