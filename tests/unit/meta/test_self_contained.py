"""The repository is self-contained: no comment, docstring or document cites a document outside it.

Code cites the repository's own docs (docs/architecture.md, docs/spec-conformance.md, docs/protocol.md,
docs/design-departures.md, the README), never the design document, the original's spec, review items
(`REV-nn`) or review and issue-tracker numbers (`#nnn`) that a reader of the repository cannot open."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.unit.meta.source_tree import ROOT, source_files

SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".sh", ".service", ".txt"}
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", ".mypy_cache",
             ".ruff_cache", ".pytest_cache", ".hypothesis"}
# each pattern is split so that this file does not match itself
OUTSIDE = {
    "a review item (REV-nn)": re.compile(r"\bREV" r"-\d+"),
    "a review or issue number (#nnn)": re.compile(r"(?<![\w&#/])#" r"\d{3,5}\b"),
    "the design document": re.compile(r"\bDESI" r"GN\b"),
    "the original's spec": re.compile(r"\bSEED" r"[-_]SPEC\b", re.IGNORECASE),
    "a path outside the repository": re.compile(r"/work/" r"shared\b"),
}


def _files() -> list[Path]:
    found = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]  # never walk a venv
        here = Path(folder)
        ci = here.relative_to(ROOT).parts[:1] == (".ci",)
        found += [here / n for n in names if Path(n).suffix in SUFFIXES or (ci and not Path(n).suffix)]
    return found


def citations(text: str) -> list[tuple[int, str, str]]:
    """(line, what, the line) of every citation of a document outside the repository in `text`."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for what, pattern in OUTSIDE.items():
            if pattern.search(line):
                out.append((lineno, what, line.strip()[:160]))
    return out


def test_the_patterns_find_what_they_are_meant_to_find() -> None:
    bad = ["see REV" "-27", "(#" "354)", "DESI" "GN §4.2", "SEED" "-SPEC §10", "/work/" "shared/x.md"]
    assert [len(citations(line)) for line in bad] == [1, 1, 1, 1, 1]
    good = ["docs/spec-conformance.md §10 item 16", "a hex colour #fff", "drop #{} of this kind", "mail #99",
            "docs/design-departures.md", "design document", "&#123;"]
    assert [citations(line) for line in good] == [[]] * len(good)


def test_no_file_cites_a_document_outside_the_repository() -> None:
    files = _files()
    assert len(files) > 100 and any(f.name == "README.md" for f in files)  # the scan sees the repository
    bad = [f"{path.relative_to(ROOT)}:{lineno}: {what}: {line}"
           for path in files for lineno, what, line in citations(path.read_text(encoding="utf-8", errors="replace"))]
    assert not bad, ("cite the repository's own docs (docs/architecture.md, docs/spec-conformance.md, docs/protocol.md, "
                     "docs/design-departures.md, README.md) instead:\n" + "\n".join(bad))


def test_no_component_cites_an_issue_number() -> None:
    """legion's own code says what and why in words; an issue number names a tracker its reader cannot open (the
    tests and benchmarks may name the issue whose acceptance they check)."""
    issue = re.compile(r"\b[Ii]ssue" r" \d+")
    bad = [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}" for path in source_files()
           for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if issue.search(line)]
    assert not bad, "component source cites an issue number:\n" + "\n".join(bad)
