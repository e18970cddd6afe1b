"""A gpu-check part for the orchestrator's tests: writes its file once, then finishes, fails or hangs."""

import argparse
import datetime as dt
import json
import os
import time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--deadline", type=float, required=True)
ap.add_argument("--simulate", action="store_true")
a = ap.parse_args()
behaviour = os.environ.get("STUB_PART", "finish")
doc = {"format": "muxflow.gpu-check.part/1", "part": os.environ.get("STUB_NAME", "xcuda"), "method": "simulated",
       "gpu": None, "started": dt.datetime.now(dt.timezone.utc).isoformat(), "ended": None, "complete": False,
       "why_incomplete": "running", "results": {"first": 1, "deadline": a.deadline}, "errors": []}
path = Path(a.out) / f"{doc['part']}.json"
path.write_text(json.dumps(doc))
if behaviour == "hang":
    while True:            # ignores its deadline: the orchestrator must kill it
        time.sleep(0.5)
if behaviour == "crash":
    raise SystemExit(3)
doc.update(complete=True, why_incomplete=None, ended=dt.datetime.now(dt.timezone.utc).isoformat())
path.write_text(json.dumps(doc))
