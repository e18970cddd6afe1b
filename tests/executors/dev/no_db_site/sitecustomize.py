"""Loaded by Python at start-up when this folder is on PYTHONPATH: importing the database and orchestration
libraries fails, as on a lent GPU machine that has none of them (``make gpu-check`` must run there)."""

import importlib.abc
import sys

BLOCKED = ("sqlalchemy", "alembic", "dagster", "ortools", "psycopg2")


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ImportError(f"{fullname} is not installed on this machine (blocked to check gpu-check needs none)")
        return None


sys.meta_path.insert(0, _Blocker())
