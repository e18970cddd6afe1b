"""The Dagster UI end to end: ``dagster-webserver`` on an instance with real rounds, read by headless Chromium.

A small main job fills a temporary Dagster instance (as ``make run`` does), the
webserver serves it the way ``make ui`` does (same ``workspace.yaml``, settings
from ``$DAGSTER_HOME/muxflow.json``), and the browser opens one round partition
of ``placement_plan`` like a user: the Partitions tab of the asset with that
partition selected. The page must show the partition key and the round's
``placements`` and ``objective`` with the values the instance and the feature
store hold.

The round looked at is the first one, not the latest: the asset's Overview tab
ignores ``?partition=`` and always shows the latest materialization, so only a
page that really selects the partition shows the first round's values.

Needs /usr/bin/chromium and /usr/bin/chromedriver (``.ci/ensure_browser.sh``
installs them): skipped without them, failed under ``CI=true``.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts"
SCREENSHOT = ARTIFACTS / "dagster_ui_placement_plan.png"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ASSET = "placement_plan"
STARTUP_TIMEOUT_S = 90  # webserver answering /server_info
RENDER_TIMEOUT_S = 60  # the partition's metadata on the page
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SHOWN = ("round_id", "window_start_utc", "placements", "objective")  # metadata labels checked on the page


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _require_browser() -> None:
    """Skip (fail under CI=true) when headless Chromium cannot be driven here."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (pip install -e '.[dev]')")
    if missing:
        msg = (f"the Dagster UI test needs {', '.join(missing)}; run 'bash .ci/ensure_browser.sh' as root "
               "or 'apt-get install -y chromium chromium-driver'")
        if _in_ci():
            pytest.fail(f"CI=true: {msg}", pytrace=False)
        pytest.skip(msg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class DagsterUI:
    url: str
    log: Path
    partition: str  # the round partition looked at (the first round, not the latest)
    latest_partition: str
    metadata: dict  # that partition's latest materialization metadata: label -> value
    store_row: dict  # that round's row in the feature store's scheduling_rounds

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"


def _build_instance(root: Path) -> tuple[Path, str, str, dict, dict]:
    """A small main job into ``root``; returns the Dagster home and what the first round recorded."""
    from dagster import AssetKey, AssetRecordsFilter, DagsterInstance
    from sqlalchemy import create_engine, text

    from pipelines.main_job import MainJobConfig, run_main_job
    from scheduler_core.predictor import PredictorConfig

    home = root / "dagster_home"
    db_url = f"sqlite:///{root / 'store.db'}"
    cfg = MainJobConfig(db_url=db_url, report_dir=root / "report", types={"t4": 8, "a10": 8}, services=3,
                        hours=0.5, jobs=20, samples_per_type=300, predictor=PredictorConfig(epochs=30, seed=0),
                        dagster_home=home)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(home))  # run_main_job sets it; the context puts the old value back
        mp.delenv("MUXFLOW_SETTINGS", raising=False)
        run_main_job(cfg, progress=None)
        assert (home / "muxflow.json").is_file()
        key = AssetKey(ASSET)
        with DagsterInstance.from_config(str(home)) as instance:
            partitions = sorted(instance.get_materialized_partitions(key))
            assert len(partitions) >= 2, f"expected at least two materialized rounds, got {partitions}"
            first = partitions[0]
            records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[first]),
                                                      limit=1).records
            assert records, f"no materialization event of {ASSET} for partition {first}"
            metadata = {k: v.value for k, v in records[0].asset_materialization.metadata.items()}
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(text("SELECT id, placements, objective FROM scheduling_rounds WHERE id = :id"),
                               {"id": metadata["round_id"]}).mappings().one()
    finally:
        engine.dispose()
    return home, first, partitions[-1], metadata, dict(row)


def _wait_for_server(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"dagster-webserver exited with {proc.returncode} before answering:\n"
                        f"{log.read_text(errors='replace')[-4000:]}", pytrace=False)
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            last = str(exc)
        time.sleep(0.25)  # poll interval
    pytest.fail(f"dagster-webserver did not answer {url}/server_info within {STARTUP_TIMEOUT_S} s ({last}):\n"
                f"{log.read_text(errors='replace')[-4000:]}", pytrace=False)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop(proc: subprocess.Popen) -> None:
    """Stop the webserver and the code server it started (their own process group): SIGTERM, then SIGKILL.

    The instance is a throwaway, so the grace period is short (a clean shutdown takes ~5-10 s).
    """
    pgid = proc.pid  # start_new_session: the webserver leads its group
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        proc.wait()
        return
    deadline = time.monotonic() + 3
    while _group_alive(pgid) and time.monotonic() < deadline:
        proc.poll()  # reap the webserver so that it does not keep the group alive as a zombie
        time.sleep(0.1)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def dagster_ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterUI]:
    root = tmp_path_factory.mktemp("dagster_ui")
    home, first, latest, metadata, store_row = _build_instance(root)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = root / "dagster-webserver.log"
    env = {**os.environ, "DAGSTER_HOME": str(home), "MUXFLOW_SETTINGS": str(home / "muxflow.json")}
    webserver = Path(sys.executable).parent / "dagster-webserver"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(webserver), "-w", str(REPO_ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO_ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        _wait_for_server(proc, url, log)
        yield DagsterUI(url, log, first, latest, metadata, store_row)
    finally:
        _stop(proc)


def _chrome():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1200"):
        opts.add_argument(arg)
    opts.binary_location = str(CHROMIUM)
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)


def _shown_metadata(partition: str):
    """A WebDriverWait condition: the selected partition's panel with its metadata rows, once all of SHOWN are visible.

    The panel is the nearest element holding both the "Metadata" heading and the
    partition key (its header), so the partition list beside it is not part of it.
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
                if label.text.strip() in SHOWN and label.is_displayed() and value.is_displayed():
                    rows[label.text.strip()] = value.text.strip()
            if header and all(rows.get(k) for k in SHOWN):
                return panel, rows
        return False

    return condition


def _dismiss_onboarding(driver) -> None:
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


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_placement_plan_partition_metadata_in_ui(request: pytest.FixtureRequest) -> None:
    _require_browser()  # before the ~30 s instance build
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    ui: DagsterUI = request.getfixturevalue("dagster_ui")
    pk, meta = ui.partition, ui.metadata
    assert pk != ui.latest_partition
    # What the instance recorded is what the feature store holds for that round.
    assert meta["placements"] == ui.store_row["placements"]
    assert math.isclose(meta["objective"], round(ui.store_row["objective"], 4), abs_tol=1e-9)

    # The Partitions tab of the asset with the round's partition selected.
    page = f"{ui.url}/assets/{ASSET}?view=partitions&partition={pk}"
    ARTIFACTS.mkdir(exist_ok=True)
    SCREENSHOT.unlink(missing_ok=True)
    driver = _chrome()
    try:
        driver.get(page)
        try:
            panel, rows = WebDriverWait(driver, RENDER_TIMEOUT_S, poll_frequency=0.25,
                                        ignored_exceptions=(StaleElementReferenceException,)).until(
                _shown_metadata(pk))
        except TimeoutException:
            driver.save_screenshot(str(SCREENSHOT))
            body = driver.find_element(By.TAG_NAME, "body").text
            pytest.fail(f"{page}: no metadata {SHOWN} for partition {pk} within {RENDER_TIMEOUT_S} s "
                        f"(screenshot {SCREENSHOT}).\npage text:\n{body[:3000]}\n"
                        f"dagster-webserver log:\n{ui.log_tail()}", pytrace=False)
        _dismiss_onboarding(driver)
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", panel)
        assert driver.save_screenshot(str(SCREENSHOT))

        context = f"{page}: rows {rows}; expected {meta}"
        assert int(_number(rows["round_id"])) == meta["round_id"], context
        assert rows["window_start_utc"] == meta["window_start_utc"], context
        assert int(_number(rows["placements"])) == meta["placements"], context
        assert math.isclose(_number(rows["objective"]), meta["objective"], rel_tol=1e-6, abs_tol=1e-9), context
        assert pk in panel.text, context
    finally:
        driver.quit()

    data = SCREENSHOT.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000, f"{SCREENSHOT}: {len(data)} bytes"
