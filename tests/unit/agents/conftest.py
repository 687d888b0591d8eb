"""Fixtures for the definition-layer tests: an isolated HOME/XDG and project, and card writers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """An explicit env mapping whose HOME is private to the test (never os.environ)."""
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home)}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / ".legion" / "agents").mkdir(parents=True)
    return root


@pytest.fixture
def user_dir(env: dict[str, str]) -> Path:
    path = Path(env["HOME"]) / ".config" / "legion"
    (path / "agents").mkdir(parents=True)
    return path


def card_text(front: str, body: str = "You do the thing.") -> str:
    return f"---\n{front.strip()}\n---\n{body}\n"


@pytest.fixture
def write_card() -> Callable[..., Path]:
    def write(directory: Path, filename: str, front: str, body: str = "You do the thing.") -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / filename
        path.write_text(card_text(front, body), encoding="utf-8")
        return path

    return write


@pytest.fixture
def write_settings() -> Callable[[Path, dict[str, Any]], Path]:
    def write(path: Path, data: dict[str, Any]) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data), encoding="utf-8")
        return path

    return write
