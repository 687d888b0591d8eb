"""The repository's reference docs name files and tests that exist.

docs/spec-conformance.md says, for each behaviour of the original, which modules implement it and which
tests pin it; docs/protocol.md and the README name the modules they describe. A path they cite
(`supervision/launch.py`, `tests/unit/agents/test_card.py`, `agents/cards/`, or
`tests/….py::test_name`) must exist, so a move or a rename that forgets the docs fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = ("docs/spec-conformance.md", "docs/protocol.md", "README.md")
TOP = ("agents/", "bus/", "ledger/", "legion/", "procs/", "supervision/", "workers/", "orchestration/", "tests/",
       "bench/", "docs/", ".ci/")
_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s#]+)")
_PLACEHOLDER = re.compile(r"[<>…*{}$]|\.\.\.")


def cited_paths(text: str) -> list[str]:
    """The repository paths (optionally `::test_name`) cited in backticks or as links in a markdown text."""
    out: list[str] = []
    for token in _CODE.findall(text) + _LINK.findall(text):
        for word in re.split(r"[\s,()]+", token):
            word = word.rstrip(".:;")
            if word.startswith(TOP) and not _PLACEHOLDER.search(word):
                out.append(word)
    return out


def missing(path: str) -> str | None:
    """Why `path` (`file`, `folder/` or `file::function`) does not exist, None when it does."""
    file, _, name = path.partition("::")
    where = ROOT / file
    if file.endswith("/") and not where.is_dir():
        return f"{file} is not a folder"
    if not where.exists():
        return f"{file} does not exist"
    if name and not re.search(rf"^\s*(async\s+)?def {re.escape(name)}\b", where.read_text(encoding="utf-8"), re.M):
        return f"{file} has no test {name}"
    return None


def test_cited_paths_are_found_and_checked() -> None:
    text = ("`supervision/launch.py` (`tests/unit/agents/test_card.py`, `agents/cards/`), `legion.db`, "
            "`artifacts/<name>/r<round>.md`, [servers](docs/servers.md), `tests/x.py::test_y`")
    assert cited_paths(text) == ["supervision/launch.py", "tests/unit/agents/test_card.py", "agents/cards/",
                                 "tests/x.py::test_y", "docs/servers.md"]
    assert missing("supervision/launch.py") is None and missing("agents/cards/") is None
    assert missing("tests/unit/meta/test_doc_references.py::test_cited_paths_are_found_and_checked") is None
    assert missing("tests/unit/meta/test_doc_references.py::test_nothing") is not None
    assert missing("supervision/no_such_module.py") is not None and missing("agents/card.py/") is not None


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_reference_doc_cites_exists(doc: str) -> None:
    paths = cited_paths((ROOT / doc).read_text(encoding="utf-8"))
    assert len(paths) >= 5, f"{doc} cites almost no path: is the pattern still right?"
    bad = sorted({f"{p}: {why}" for p in paths if (why := missing(p)) is not None})
    assert not bad, f"{doc} cites what does not exist; update it to the code:\n" + "\n".join(bad)
