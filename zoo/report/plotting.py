"""Figures as files: deterministic PNG bytes (the leaderboard's and ``zoo validate``'s)."""

from __future__ import annotations

import io


def png_bytes(fig) -> bytes:
    """A matplotlib figure as deterministic PNG bytes (no software stamp); the figure is closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()
