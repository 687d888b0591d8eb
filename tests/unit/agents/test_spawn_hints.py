"""Spawn hints (docs/spec-conformance.md §2.11): credentials beat model resolution, idempotent, none where the message says the fix."""

from __future__ import annotations

from legion.agents.spawn_hints import append_hint


def test_credential_failure_gets_the_key_hint_naming_the_provider() -> None:
    msg = "provider 'anthropic': API key missing — environment variable ANTHROPIC_API_KEY is not set"
    out = append_hint(msg)
    assert out.startswith(msg) and "Hint: the key for provider 'anthropic'" in out


def test_credentials_beat_the_model_marker_and_the_hint_is_idempotent() -> None:
    msg = "model resolve failed: Authentication failed for openai"
    once = append_hint(msg)
    assert "the key" in once and "check the model" not in once
    assert append_hint(once) == once


def test_model_resolution_failure_points_at_doctor_models() -> None:
    out = append_hint("unknown provider 'nope' in model 'nope/x'; known providers: anthropic")
    assert "legion doctor models" in out


def test_no_hint_for_codes_that_carry_their_fix_or_for_plain_errors() -> None:
    assert append_hint("unknown model 'x'", "BUDGET_EXCEEDED") == "unknown model 'x'"
    assert append_hint("disk full") == "disk full"
    assert append_hint("x --- Legion auto-doctor\nunknown provider") == "x --- Legion auto-doctor\nunknown provider"
