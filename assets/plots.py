"""Small plots rendered to PNG and embedded in Dagster metadata (the UI shows Markdown images)."""

from __future__ import annotations

import base64
import io

from dagster import MetadataValue


def png_markdown(fig, alt: str) -> MetadataValue:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()})")


def predicted_vs_realised_plot(rows: list[dict], simulated: bool) -> MetadataValue | None:
    """Scatter of predicted against realised normalized throughput, one point per placement."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    colors = {"start": "#4c72b0", "keep": "#55a868", "migrate": "#dd8452"}
    for action, color in colors.items():
        pts = [r for r in rows if r["action"] == action]
        if pts:
            ax.scatter([r["predicted"] for r in pts], [r["realised"] for r in pts], s=14, c=color, label=action)
    ax.plot([0, 1], [0, 1], color="grey", linewidth=1, linestyle="--")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("predicted normalized throughput")
    ax.set_ylabel("realised in the window" + (" (SIMULATED)" if simulated else ""))
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return png_markdown(fig, "predicted vs realised normalized throughput")
