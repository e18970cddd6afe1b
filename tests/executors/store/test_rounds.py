"""Round rows read back by key of their snapshot, on SQLite and PostgreSQL (the JSON subscript is each dialect's)."""

from __future__ import annotations

import datetime as dt

from executors.store import repo
from executors.store.db import Store
from executors.store.rounds import round_snapshot_values
from scheduler_core.domain import RoundResult

W0 = dt.datetime(2026, 3, 2, 8, 0, tzinfo=dt.timezone.utc)
EMPTY = RoundResult([], [], 0.0, 0, 0, 0)


def test_snapshot_values_of_the_rounds_that_can_cover_a_window(store: Store) -> None:
    with store.session() as s:
        for k, factors in enumerate([{"svc": {"factor": 1.5}}, None, {"svc": {"factor": 1.2}, "other": {"factor": 1}}]):
            snapshot = {"allowance_correction": factors} if factors is not None else {"other_key": 1}
            repo.record_round(s, W0 + dt.timedelta(minutes=15 * k), EMPTY, snapshot, True, 0, {})
        # a fill of the last window: never one of the rounds read
        repo.record_round(s, W0 + dt.timedelta(minutes=30), EMPTY, {"allowance_correction": {"svc": {"factor": 9}}},
                          True, 0, {}, seq=1)
    with store.session() as s:
        got = round_snapshot_values(s, "allowance_correction", W0 + dt.timedelta(minutes=10),
                                    W0 + dt.timedelta(hours=1))
        # the round of 08:00 covers 08:10 (its window is 15 min long); the 08:15 round stored no such key
        assert got == [(W0, {"svc": {"factor": 1.5}}), (W0 + dt.timedelta(minutes=15), None),
                       (W0 + dt.timedelta(minutes=30), {"svc": {"factor": 1.2}, "other": {"factor": 1}})]
        assert round_snapshot_values(s, "allowance_correction", W0 + dt.timedelta(hours=2),
                                     W0 + dt.timedelta(hours=3)) == []
