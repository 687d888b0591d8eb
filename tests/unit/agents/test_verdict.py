"""The reviewer's `legion-verdict` block."""

from __future__ import annotations

from typing import Any, cast

import pytest

from legion.agents import Verdict, VerdictError, VerdictIssue, find_verdict, format_verdict, parse_verdict


def answer(block: str, before: str = "Looks mostly fine.\n") -> str:
    return f"{before}\n```legion-verdict\n{block}\n```\n"


def test_parses_ok_summary_and_issues() -> None:
    text = answer(
        '{"ok": false, "summary": "two bugs", "issues": ['
        '{"severity": "blocker", "file": "a.py", "line": 3, "message": "crash"}, "plain note"]}'
    )
    v = parse_verdict(text)
    assert v.ok is False and v.summary == "two bugs"
    assert v.issues == (VerdictIssue("crash", "blocker", "a.py", 3), VerdictIssue("plain note"))
    assert v.blockers == (VerdictIssue("crash", "blocker", "a.py", 3),)


def test_the_last_block_wins_and_other_fences_are_ignored() -> None:
    text = (
        '```json\n{"ok": false}\n```\n'
        + answer('{"ok": false, "summary": "first"}')
        + answer('{"ok": true, "summary": "second", "extra": 1}', before="Re-checked.")
    )
    assert parse_verdict(text) == Verdict(ok=True, summary="second")


def test_round_trip_through_format_verdict() -> None:
    v = Verdict(False, "s", (VerdictIssue("m", "nit", None, None), VerdictIssue("n", "major", "f.py", 9)))
    assert parse_verdict("prose\n" + format_verdict(v)) == v


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("no block at all", "no ```legion-verdict block"),
        (answer("{not json"), "not valid JSON"),
        (answer("[1]"), "must be a JSON object"),
        (answer('{"ok": "yes", "summary": "s"}'), '"ok" must be true or false'),
        (answer('{"ok": true}'), '"summary" must be a non-empty string'),
        (answer('{"ok": true, "summary": "s", "issues": {}}'), '"issues" must be a list'),
        (
            answer('{"ok": true, "summary": "s", "issues": [{"severity": "huge", "message": "m"}]}'),
            "severity",
        ),
        (answer('{"ok": true, "summary": "s", "issues": [{"message": "m", "line": 0}]}'), "positive integer"),
        (answer('{"ok": true, "summary": "s", "issues": [{"line": 2}]}'), r"issues\[0\].message"),
        ('```legion-verdict\n{"ok": true, "summary": "unterminated"}\n', "no ```legion-verdict block"),
    ],
)
def test_malformed_verdicts_are_verdict_errors(text: str, needle: str) -> None:
    with pytest.raises(VerdictError, match=needle):
        parse_verdict(text)
    assert find_verdict(text) is None


def test_ok_true_with_a_blocker_or_major_issue_is_refused() -> None:
    for severity in ("blocker", "major"):
        text = answer(
            f'{{"ok": true, "summary": "s", "issues": [{{"severity": "{severity}", "message": "m"}}]}}'
        )
        with pytest.raises(VerdictError, match=rf'"ok" is true but issues\[0\] is a {severity}'):
            parse_verdict(text)
        assert find_verdict(text) is None
    # unlabelled issues follow the judgement; minor/nit issues do not block an ok verdict
    ok = parse_verdict(answer('{"ok": true, "summary": "s", "issues": ["rename x", {"message": "m"}]}'))
    assert [i.severity for i in ok.issues] == ["minor", "minor"]
    ok = parse_verdict(
        answer('{"ok": true, "summary": "s", "issues": [{"severity": "nit", "message": "m"}]}')
    )
    assert ok.ok and ok.blockers == ()
    bad = parse_verdict(answer('{"ok": false, "summary": "s", "issues": ["crash on empty input"]}'))
    assert bad.issues[0].severity == "major"


def test_non_text_input_is_a_verdict_error() -> None:
    with pytest.raises(VerdictError):
        parse_verdict(cast(Any, None))


@pytest.mark.timeout(20)
def test_huge_answers_are_scanned_only_at_the_tail() -> None:
    noise = "```legion-verdict\n" * 20_000 + "x" * 1_000_000
    text = noise + answer('{"ok": true, "summary": "fine"}')
    assert parse_verdict(text).ok is True
    assert find_verdict(noise) is None
