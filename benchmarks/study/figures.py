"""Writing a study's figure: one place for the layout, folder, resolution and closing every report does."""
from __future__ import annotations

from pathlib import Path


def save_figure(fig, path: Path, dpi: int = 80) -> Path:
    """Lay out ``fig``, write it to ``path`` (its folder made if missing) and close it, so a report that draws many
    figures holds none open."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
