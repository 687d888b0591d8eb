"""The repository's reference docs name files and tests that exist.

docs/spec-conformance.md says, for each behaviour of the original, which modules implement it and which
tests pin it; docs/protocol.md and the README name the modules they describe. A path they cite
(`orchestration/launch.py`, `tests/unit/agents/test_card.py`, `agents/cards/`, or
`tests/….py::test_name`) must exist, so a move or a rename that forgets the docs fails here. And a
comment's `docs/architecture.md §N`, `docs/spec-conformance.md §N.M` (or `§10 item N`) or `docs/protocol.md §N`
must name a section (a numbered heading, or a numbered list item of a section) or item that exists."""

from __future__ import annotations

import os
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
    text = ("`orchestration/launch.py` (`tests/unit/agents/test_card.py`, `agents/cards/`), `legion.db`, "
            "`artifacts/<name>/r<round>.md`, [servers](docs/servers.md), `tests/x.py::test_y`")
    assert cited_paths(text) == ["orchestration/launch.py", "tests/unit/agents/test_card.py", "agents/cards/",
                                 "tests/x.py::test_y", "docs/servers.md"]
    assert missing("orchestration/launch.py") is None and missing("agents/cards/") is None
    assert missing("tests/unit/meta/test_doc_references.py::test_cited_paths_are_found_and_checked") is None
    assert missing("tests/unit/meta/test_doc_references.py::test_nothing") is not None
    assert missing("supervision/no_such_module.py") is not None and missing("agents/card.py/") is not None


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_reference_doc_cites_exists(doc: str) -> None:
    paths = cited_paths((ROOT / doc).read_text(encoding="utf-8"))
    assert len(paths) >= 5, f"{doc} cites almost no path: is the pattern still right?"
    bad = sorted({f"{p}: {why}" for p in paths if (why := missing(p)) is not None})
    assert not bad, f"{doc} cites what does not exist; update it to the code:\n" + "\n".join(bad)


CITABLE = ("architecture", "spec-conformance", "protocol")
_CITATION = re.compile(r"docs/(architecture|spec-conformance|protocol)\.md\s+§\s*(\d+(?:\.\d+)*)"
                       r"(?:\s+items?\s+(\d+)(?:\s*[–-]\s*(\d+))?)?")
_SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "build", "dist", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def sections(text: str) -> set[str]:
    """The citable section numbers of a doc: numbered headings (`## 4.`, `### 4.2`) and the numbered list
    items of a top-level section (`9.2` for item 2 of `## 9.`)."""
    found: set[str] = set()
    top: str | None = None
    for line in text.splitlines():
        heading = re.match(r"^(#+)\s+(\d+(?:\.\d+)*)[.\s]", line)
        if heading:
            found.add(heading.group(2))
            top = heading.group(2).split(".")[0] if len(heading.group(1)) == 2 else top
        elif (item := re.match(r"^(\d+)\.\s", line)) and top is not None:
            found.add(f"{top}.{item.group(1)}")
    return found


def regression_items(text: str) -> set[int]:
    """The item numbers of spec-conformance §10's table (first cells such as `11, 13`, `1–2`)."""
    body = text.split("\n## 10.", 1)[1].split("\n## ", 1)[0]
    out: set[int] = set()
    for cell in re.findall(r"^\|\s*(\d[\d,–\- ]*)\|", body, re.M):
        for part in cell.split(","):
            first, _, last = part.strip().replace("–", "-").partition("-")
            out |= set(range(int(first), int(last or first) + 1))
    return out


def test_sections_and_items_are_parsed() -> None:
    doc = "## 4. Bus\n### 4.2 Frames\n## 9. Decisions\n1. **a**\n2. **b**\n## 10. Regressions\n| # | x |\n|---|---|\n| 1–2 | a |\n| 11, 13 | b |\n"
    assert sections(doc) == {"4", "4.2", "9", "9.1", "9.2", "10"}
    assert regression_items(doc) == {1, 2, 11, 13}


def test_every_doc_section_a_comment_cites_exists() -> None:
    texts = {name: (ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8") for name in CITABLE}
    known = {name: sections(text) for name, text in texts.items()}
    items = regression_items(texts["spec-conformance"])
    bad: list[str] = []
    seen = 0
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        for name in names:
            if not name.endswith((".py", ".md")):
                continue
            path = Path(folder) / name
            for m in _CITATION.finditer(path.read_text(encoding="utf-8", errors="replace")):
                seen += 1
                doc, number, first, last = m.groups()
                where = f"{path.relative_to(ROOT)}: {m.group(0)}"
                if number not in known[doc]:
                    bad.append(f"{where}: docs/{doc}.md has no section {number}")
                if first and doc == "spec-conformance" and number == "10":
                    bad += [f"{where}: §10 has no item {i}" for i in range(int(first), int(last or first) + 1)
                            if i not in items]
    assert seen > 100  # the scan sees the code's citations
    assert not bad, "citations of sections that do not exist:\n" + "\n".join(bad)


COMPONENTS = ("bus", "ledger", "agents", "workers", "supervision", "procs", "orchestration")
_DOTTED = re.compile(r"\blegion\.(?:" + "|".join(COMPONENTS) + r")(?:\.[A-Za-z_]\w*)+")


def _defines(module: Path, name: str) -> bool:
    text = module.read_text(encoding="utf-8")
    return re.search(rf"^\s*(?:async\s+def|def|class)\s+{name}\b|^\s*{name}\s*[:=]|\bimport\b.*\b{name}\b|"
                     rf"^\s+{name},$|[\"']{name}[\"']\s*:", text, re.M) is not None


def unresolved(dotted: str) -> str | None:
    """Why `legion.<component>.<module>[.<name>…]` names no module or module attribute, None when it does."""
    parts = dotted.split(".")[1:]
    where = ROOT / parts[0]
    if not where.is_dir():
        return None  # a component another branch adds: nothing to check yet
    for i, part in enumerate(parts[1:], 1):
        if (where / part).is_dir() and (where / part / "__init__.py").exists():
            where = where / part
        elif (where / f"{part}.py").exists():
            module = where / f"{part}.py"
            rest = parts[i + 1:]
            return None if not rest or _defines(module, rest[0]) else f"{module.relative_to(ROOT)} has no {rest[0]}"
        else:
            init = where / "__init__.py"
            return None if _defines(init, part) else f"no module or name {part} in {where.relative_to(ROOT)}/"
    return None


def test_dotted_names_are_resolved() -> None:
    assert unresolved("legion.agents.phases.validate_phases") is None
    assert unresolved("legion.bus.monitor") is None and unresolved("legion.ledger.open_ledger") is None
    assert unresolved("legion.ledger.phase_machine") is not None
    assert unresolved("legion.agents.phases.parse_phase_machine") is not None


def _settings_keys() -> set[str]:
    """The `legion.…` settings keys (docs/settings.md's table): `legion.ledger.url` is a setting, not code."""
    table = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `(legion\.[\w.]+)` \|", table, re.M))


def test_every_module_a_docstring_or_comment_names_exists() -> None:
    """A docstring that describes `legion.ledger.phase_machine` when there is none is caught here."""
    settings = _settings_keys()
    assert "legion.ledger.url" in settings
    bad: list[str] = []
    seen = 0
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and d != "tests" and not d.endswith(".egg-info")]
        for name in names:
            if not name.endswith((".py", ".md")):
                continue
            path = Path(folder) / name
            for m in _DOTTED.finditer(path.read_text(encoding="utf-8", errors="replace")):
                seen += 1
                if m.group(0) not in settings and (why := unresolved(m.group(0))) is not None:
                    bad.append(f"{path.relative_to(ROOT)}: {m.group(0)}: {why}")
    assert seen > 50
    assert not bad, "names of code that does not exist:\n" + "\n".join(sorted(set(bad)))
