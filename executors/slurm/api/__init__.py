"""slurmrestd OpenAPI versions, chosen by name (a setting, DESIGN §4)."""

from __future__ import annotations

import time
from collections.abc import Callable

from executors.slurm.api.base import ApiVersion
from executors.slurm.api.v0_0_38 import V0038
from executors.slurm.api.v0_0_40 import V0040

API_VERSIONS: dict[str, type[ApiVersion]] = {cls.name: cls for cls in (V0038, V0040)}
DEFAULT_API_VERSION = V0038.name


def api_version(name: str, clock: Callable[[], float] = time.time) -> ApiVersion:
    """The builder/parser set for ``name`` (``"v0.0.38"``, ``"v0.0.40"``; the leading ``v`` optional)."""
    key = name if name.startswith("v") else f"v{name}"
    try:
        return API_VERSIONS[key](clock)
    except KeyError:
        raise ValueError(f"slurm api version: unknown {name!r}; supported: {', '.join(sorted(API_VERSIONS))}") \
            from None


__all__ = ["API_VERSIONS", "DEFAULT_API_VERSION", "ApiVersion", "api_version"]
