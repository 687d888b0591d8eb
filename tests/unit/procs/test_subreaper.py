"""Subreaper marking: prctl through the libc already loaded, no helper process per call."""

from __future__ import annotations

import ctypes.util

import pytest

from legion.procs import subreaper


def test_prctl_resolves_libc_without_running_ldconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every forked worker marks itself a subreaper on its way to `ready`: `find_library` would run
    `ldconfig -p` in a subprocess there (~6 ms of its launch)."""

    def no_lookup(name: str) -> str | None:
        raise AssertionError(f"find_library({name!r}) runs a subprocess")

    monkeypatch.setattr(subreaper, "_libc", None)
    monkeypatch.setattr(ctypes.util, "find_library", no_lookup)
    before = subreaper.is_child_subreaper()
    subreaper.set_child_subreaper(True)
    try:
        assert subreaper.is_child_subreaper()
    finally:
        subreaper.set_child_subreaper(before)
    assert subreaper.is_child_subreaper() is before
