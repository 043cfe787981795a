"""benchmarks/RESULTS.md: one ``## `` section per benchmark, rewritten by its script and leaving the others alone."""
from __future__ import annotations

import os
import re
from pathlib import Path

_LINK = re.compile(r"(\]\()([^)\s#][^)\s]*)(\))")


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


def remove_section(path: Path, heading_names: str, replacement: str = "") -> bool:
    """Remove the section whose ``## `` heading contains ``heading_names`` (or put ``replacement`` in its place);
    False when there is none."""
    if not path.exists():
        return False
    text = path.read_text()
    start = next((m for m in _heading_starts(text) if heading_names in text[m:].split("\n", 1)[0]), -1)
    if start < 0:
        return False
    end = text.find("\n## ", start + 3)
    middle = replacement.rstrip("\n") + "\n\n" if replacement else ""
    path.write_text((text[:start] + middle + (text[end + 1:] if end >= 0 else "")).rstrip("\n") + "\n")
    return True


def _heading_starts(text: str) -> list[int]:
    starts = [0] if text.startswith("## ") else []
    i = text.find("\n## ")
    while i >= 0:
        starts.append(i + 1)
        i = text.find("\n## ", i + 1)
    return starts


def rebase_links(section: str, written_in: Path, placed_in: Path) -> str:
    """``section``'s relative Markdown links and images, written for a file in ``written_in`` (a study's REPORT.md),
    made to point at the same files from ``placed_in`` (RESULTS.md's folder); URLs and absolute paths stay."""
    def rebase(m: re.Match) -> str:
        target = m.group(2)
        if "://" in target or target.startswith("/"):
            return m.group(0)
        moved = os.path.relpath(os.path.normpath(Path(written_in).resolve() / target), Path(placed_in).resolve())
        return m.group(1) + Path(moved).as_posix() + m.group(3)
    return _LINK.sub(rebase, section)
