"""benchmarks/RESULTS.md: one ``## `` section per benchmark, rewritten by its script and leaving the others alone."""
from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, heading: str, section: str, header: str = "# Benchmarks\n") -> None:
    """Replace the section that starts with ``heading`` by ``section`` (or append it; ``header`` starts a new file)."""
    text = path.read_text() if path.exists() else header
    start = text.find(heading)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + section.rstrip("\n") + "\n\n" + (text[end + 1:] if end >= 0 else "")
    path.write_text(text.rstrip("\n") + "\n")
