"""The Dagster UI as a user sees it: ``dagster-webserver`` on an instance, read by headless Chromium (selenium).

Needs /usr/bin/chromium and /usr/bin/chromedriver (``.ci/ensure_browser.sh`` installs them): tests
are skipped without them, and fail under ``CI=true``.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.processes import Proc, Processes

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
STARTUP_TIMEOUT_S = 90  # webserver answering /server_info


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require_browser() -> None:
    """Skip (fail under CI=true) when headless Chromium cannot be driven here."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (pip install -e '.[dev]')")
    if missing:
        msg = (f"the Dagster UI test needs {', '.join(missing)}; run 'bash .ci/ensure_browser.sh' as root "
               "or 'apt-get install -y chromium chromium-driver'")
        if in_ci():
            pytest.fail(f"CI=true: {msg}", pytrace=False)
        pytest.skip(msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_webserver(procs: Processes, env: dict, user: str | None = None) -> tuple[Proc, str]:
    """``dagster-webserver`` on the instance and settings of ``env`` (DAGSTER_HOME, MUXFLOW_SETTINGS), as
    ``make ui`` runs it (as ``user``, where given); returns once it answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    webserver = Path(sys.executable).parent / "dagster-webserver"
    proc = procs.start("dagster-webserver", [str(webserver), "-w", str(REPO_ROOT / "workspace.yaml"),
                                             "-h", "127.0.0.1", "-p", str(port)], env=env, cwd=REPO_ROOT,
                        user=user)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        if not proc.alive():
            pytest.fail(f"dagster-webserver exited with {proc.popen.returncode} before answering:\n"
                        f"{proc.log_tail(4000)}", pytrace=False)
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=2) as resp:
                if resp.status == 200:
                    return proc, url
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            last = str(exc)
        time.sleep(0.25)  # poll interval
    pytest.fail(f"dagster-webserver did not answer {url}/server_info within {STARTUP_TIMEOUT_S} s ({last}):\n"
                f"{proc.log_tail(4000)}", pytrace=False)


def chrome():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1200",
                "--disable-background-networking", "--disable-component-update", "--no-first-run"):
        opts.add_argument(arg)
    opts.binary_location = str(CHROMIUM)
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)


def shown_metadata(partition: str, labels: tuple[str, ...]):
    """A WebDriverWait condition: the selected partition's panel with its metadata rows, once all of ``labels``
    are visible.

    The panel is the nearest element holding both the "Metadata" heading and the partition
    key (its header), so the partition list beside it is not part of it.
    """
    from selenium.webdriver.common.by import By

    panel_xpath = (f"//*[normalize-space(text())='Metadata']"
                   f"/ancestor::*[.//*[normalize-space(text())='{partition}']][1]")

    def condition(driver):
        for panel in driver.find_elements(By.XPATH, panel_xpath):
            header = [e for e in panel.find_elements(By.XPATH, f".//*[normalize-space(text())='{partition}']")
                      if e.is_displayed()]
            rows = {}
            for tr in panel.find_elements(By.XPATH, ".//tr[count(td) >= 2]"):
                label, value = tr.find_elements(By.TAG_NAME, "td")[:2]
                if label.text.strip() in labels and label.is_displayed() and value.is_displayed():
                    rows[label.text.strip()] = value.text.strip()
            if header and all(rows.get(k) for k in labels):
                return panel, rows
        return False

    return condition


def dismiss_onboarding(driver) -> None:
    """Close the "Join the Dagster community" dialog a fresh instance shows, as a user would (Skip)."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    for button in driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):
        try:
            if button.is_displayed():
                button.click()
                WebDriverWait(driver, 10).until(ec.invisibility_of_element(button))
        except (StaleElementReferenceException, WebDriverException):
            pass


def partition_metadata(url: str, asset: str, partition: str, labels: tuple[str, ...], screenshot: Path,
                       timeout_s: float = 60.0, server_log: str = "") -> tuple[str, dict[str, str]]:
    """Open the Partitions tab of ``asset`` with ``partition`` selected; the panel text and the ``labels`` rows."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = f"{url}/assets/{asset}?view=partitions&partition={partition}"
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    screenshot.unlink(missing_ok=True)
    driver = chrome()
    try:
        driver.get(page)
        try:
            panel, rows = WebDriverWait(driver, timeout_s, poll_frequency=0.25,
                                        ignored_exceptions=(StaleElementReferenceException,)).until(
                shown_metadata(partition, labels))
        except TimeoutException:
            driver.save_screenshot(str(screenshot))
            body = driver.find_element(By.TAG_NAME, "body").text
            pytest.fail(f"{page}: no metadata {labels} for partition {partition} within {timeout_s} s "
                        f"(screenshot {screenshot}).\npage text:\n{body[:3000]}\n"
                        f"dagster-webserver log:\n{server_log}", pytrace=False)
        dismiss_onboarding(driver)
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", panel)
        assert driver.save_screenshot(str(screenshot))
        return panel.text, rows
    finally:
        driver.quit()


def number(text: str) -> float:
    return float(text.replace(",", ""))
