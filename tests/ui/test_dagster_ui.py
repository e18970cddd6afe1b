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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.processes import Proc, processes
from tests.ui.browser import number, partition_metadata, require_browser, start_webserver

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts"
SCREENSHOT = ARTIFACTS / "dagster_ui_placement_plan.png"
ASSET = "placement_plan"
RENDER_TIMEOUT_S = 60  # the partition's metadata on the page
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SHOWN = ("round_id", "window_start_utc", "placements", "objective")  # metadata labels checked on the page


@dataclass(frozen=True)
class DagsterUI:
    url: str
    server: Proc
    partition: str  # the round partition looked at (the first round, not the latest)
    latest_partition: str
    metadata: dict  # that partition's latest materialization metadata: label -> value
    store_row: dict  # that round's row in the feature store's scheduling_rounds

    def log_tail(self, chars: int = 4000) -> str:
        return self.server.log_tail(chars)


def _build_instance(root: Path) -> tuple[Path, str, str, dict, dict]:
    """A small main job into ``root``; returns the Dagster home and what the first round recorded."""
    from dagster import AssetKey, AssetRecordsFilter, DagsterInstance
    from sqlalchemy import create_engine, text

    from pipelines.main_job import MainJobConfig, run_main_job
    from scheduler_core.prediction.predictor import PredictorConfig

    home = root / "dagster_home"
    db_url = f"sqlite:///{root / 'store.db'}"
    cfg = MainJobConfig(db_url=db_url, report_dir=root / "report", types={"t4": 8, "a10": 8}, services=3,
                        hours=0.5, jobs=20, samples_per_type=300, predictor=PredictorConfig(epochs=80, seed=0),
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


@pytest.fixture(scope="module")
def dagster_ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterUI]:
    root = tmp_path_factory.mktemp("dagster_ui")
    home, first, latest, metadata, store_row = _build_instance(root)
    env = {**os.environ, "DAGSTER_HOME": str(home), "MUXFLOW_SETTINGS": str(home / "muxflow.json")}
    with processes(root) as procs:
        server, url = start_webserver(procs, env)
        yield DagsterUI(url, server, first, latest, metadata, store_row)


def test_placement_plan_partition_metadata_in_ui(request: pytest.FixtureRequest) -> None:
    require_browser()  # before the ~30 s instance build
    ui: DagsterUI = request.getfixturevalue("dagster_ui")
    pk, meta = ui.partition, ui.metadata
    assert pk != ui.latest_partition
    # What the instance recorded is what the feature store holds for that round.
    assert meta["placements"] == ui.store_row["placements"]
    assert math.isclose(meta["objective"], round(ui.store_row["objective"], 4), abs_tol=1e-9)

    # The Partitions tab of the asset with the round's partition selected.
    text, rows = partition_metadata(ui.url, ASSET, pk, SHOWN, SCREENSHOT, RENDER_TIMEOUT_S, ui.log_tail())
    context = f"{pk}: rows {rows}; expected {meta}"
    assert int(number(rows["round_id"])) == meta["round_id"], context
    assert rows["window_start_utc"] == meta["window_start_utc"], context
    assert int(number(rows["placements"])) == meta["placements"], context
    assert math.isclose(number(rows["objective"]), meta["objective"], rel_tol=1e-6, abs_tol=1e-9), context
    assert pk in text, context

    data = SCREENSHOT.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000, f"{SCREENSHOT}: {len(data)} bytes"
