"""slurmrestd OpenAPI versions, chosen by name (a setting, docs/DESIGN.md §4)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from executors.slurm.api.base import ApiVersion
from executors.slurm.api.v0_0_38 import V0038
from executors.slurm.api.v0_0_40 import V0040, V0041, V0042
from executors.slurm.errors import SlurmUnsupported

API_VERSIONS: dict[str, type[ApiVersion]] = {cls.name: cls for cls in (V0038, V0040, V0041, V0042)}
AUTO = "auto"  # the newest version the server offers (its OpenAPI document), found on first use
DEFAULT_API_VERSION = AUTO
_PATH_VERSION = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")


def _key(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in name.lstrip("v").split("."))


def offered_versions(openapi: dict) -> list[str]:
    """The ``/slurm/vX.Y.Z/`` versions an OpenAPI document (``GET /openapi/v3``) has paths for, oldest first."""
    found = {m.group(1) for path in (openapi.get("paths") or {}) if (m := _PATH_VERSION.match(str(path)))}
    return sorted(found, key=_key)


def newest_supported(openapi: dict) -> str:
    """The newest version both the server (its OpenAPI document) and this client speak."""
    offered = offered_versions(openapi)
    common = [v for v in offered if v in API_VERSIONS]
    if not common:
        raise SlurmUnsupported(f"slurmrestd offers {', '.join(offered) or 'no /slurm/ version'}; this client speaks "
                               f"{', '.join(sorted(API_VERSIONS, key=_key))}")
    return common[-1]


def api_version(name: str, clock: Callable[[], float] = time.time) -> ApiVersion:
    """The builder/parser set for ``name`` (``"v0.0.38"`` … ``"v0.0.42"``; the leading ``v`` optional)."""
    key = name if name.startswith("v") else f"v{name}"
    try:
        return API_VERSIONS[key](clock)
    except KeyError:
        raise ValueError(f"slurm api version: unknown {name!r}; supported: {AUTO}, "
                         f"{', '.join(sorted(API_VERSIONS, key=_key))}") from None


__all__ = ["API_VERSIONS", "AUTO", "DEFAULT_API_VERSION", "ApiVersion", "api_version", "newest_supported",
           "offered_versions"]
