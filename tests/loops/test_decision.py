"""Reading a decider's answer, and the `checks` decider. Pure: no database."""

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from loops import decision
from loops.decision import (
    CHECK_OUTPUT_CHARS,
    CHECKS_OUTPUT_TOTAL_CHARS,
    MAX_INSTRUCTION_CHARS,
    MAX_REASON_CHARS,
    VERDICTS,
    Decision,
    act_failure,
    backpressure,
    from_checks,
    is_degenerate,
    normalise,
    parse,
)
from loops.policy import Check
from tether.storable import storable

NOT_UNDERSTOOD = "could not be understood"


# -- structured answers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "verdict", "reason", "instruction"),
    [
        ('{"verdict": "done", "reason": "all tests pass"}', "done", "all tests pass", ""),
        ('{"verdict": "continue", "reason": "r", "next_instruction": "fix x"}', "continue", "r", "fix x"),
        ('{"decision": "escalate", "why": "needs a key"}', "escalate", "needs a key", ""),
        ('{"status": "failed", "reason": "cannot build"}', "failed", "cannot build", ""),
        ('{"action": "continue", "next": "add docs"}', "continue", None, "add docs"),
        ('{"verdict": "continue", "instruction": "run tests"}', "continue", None, "run tests"),
        ('{"Verdict": "DONE", "Reason": "ok"}', "done", "ok", ""),
        ('{"nextInstruction": "lint", "verdict": "retry"}', "continue", None, "lint"),
        ('{"next-instruction": "lint", "verdict": "next"}', "continue", None, "lint"),
        ('  \n{"verdict": "done", "reason": "  padded  "}\n  ', "done", "padded", ""),
        ('{"verdict": "done", "reason": "trailing comma",}', "done", "trailing comma", ""),
        ('{"decision": {"verdict": "retry", "next_instruction": "again"}}', "continue", None, "again"),
        (
            '{"verdict": "continue", "next_instruction": ["step one", "step two"]}',
            "continue",
            None,
            "step one\nstep two",
        ),
        ('{"verdict": "done", "reason": {"tests": "pass"}}', "done", '{"tests": "pass"}', ""),
        # A next instruction means nothing once the run is over; an escalated run keeps it for its resume.
        ('{"verdict": "done", "reason": "r", "next_instruction": "ignored"}', "done", "r", ""),
        ('{"verdict": "failed", "reason": "r", "next_instruction": "ignored"}', "failed", "r", ""),
        (
            '{"verdict": "escalate", "reason": "r", "next_instruction": "then migrate"}',
            "escalate",
            "r",
            "then migrate",
        ),
        # Agreeing keys are not a contradiction; keys naming nothing known are ignored next to one that does.
        ('{"verdict": "done", "status": "complete"}', "done", None, ""),
        ('{"verdict": "done", "action": "report"}', "done", None, ""),
    ],
)
def test_parse_json_object(text, verdict, reason, instruction):
    result = parse(text)
    assert result.verdict == verdict
    if reason is not None:
        assert result.reason == reason
    assert result.next_instruction == instruction


@pytest.mark.parametrize(
    "text",
    [
        '```json\n{"verdict": "done", "reason": "ok"}\n```',
        '```JSON\n{"verdict": "done", "reason": "ok"}\n```',
        '```\n{"verdict": "done", "reason": "ok"}\n```',
        'Here is my decision:\n```json\n{"verdict": "done", "reason": "ok"}\n```\nThanks.',
        'Thinking... the tests pass. {"verdict": "done", "reason": "ok"} That is all.',
        'Some {braces} first, then {"verdict": "done", "reason": "ok"}',
        '{"note": "not a decision"}\n{"verdict": "done", "reason": "ok"}',
    ],
)
def test_parse_fenced_and_embedded_json(text):
    assert parse(text) == Decision("done", "ok")


@pytest.mark.parametrize(
    ("value", "verdict"),
    [
        *[
            (v, "done")
            for v in ["done", "complete", "completed", "finished", "COMPLETE", "Finished", "success"]
        ],
        *[(v, "failed") for v in ["failed", "fail", "give up", "Give Up", "GIVE-UP", "gave up", "abort"]],
        *[
            (v, "escalate")
            for v in ["escalate", "needs human", "Needs_Human", "ask", "ASK", "need help", "blocked"]
        ],
        *[
            (v, "continue")
            for v in ["continue", "next", "retry", "RETRY", "in_progress", "keep going", "not done"]
        ],
        ("done!", "done"),
        ("  Continue.  ", "continue"),
        ("done - all checks pass", "done"),
        ("needs human input", "escalate"),
    ],
)
def test_verdict_aliases_case_insensitive(value, verdict):
    assert parse(json.dumps({"verdict": value})).verdict == verdict
    assert parse(json.dumps({"status": value})).verdict == verdict


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"verdict": "done", "status": "continue"}', "contradictory"),
        ('{"verdict": "banana"}', "no known verdict"),
        ('{"verdict": "done"} and then {"verdict": "continue", "next": "x"}', "contradictory"),
        ('```json\n{"verdict": "done"}\n```\n```json\n{"verdict": "failed"}\n```', "contradictory"),
    ],
)
def test_unreadable_or_contradictory_json_escalates(text, problem):
    result = parse(text)
    assert result.verdict == "escalate"
    assert NOT_UNDERSTOOD in result.reason
    assert problem in result.reason


def test_json_without_a_verdict_key_is_read_as_prose():
    assert parse('{"result": "ok", "count": 3}').verdict == "escalate"


def test_agreeing_json_objects_use_the_last():
    text = '{"verdict": "continue", "next": "a"}\n{"verdict": "continue", "next": "b"}'
    assert parse(text).next_instruction == "b"


# -- prose answers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("Done.", "done"),
        ("done", "done"),
        ("**DONE**", "done"),
        ("DONE — all tests pass.", "done"),
        ("The objective is complete: every test passes.", "done"),
        ("Verdict: done", "done"),
        ("**Verdict**: Continue\nNext: fix the import", "continue"),
        ('"status": "escalate"', "escalate"),
        ("Status: complete", "done"),
        ("The work is not done yet; keep going.", "continue"),
        ("It isn't finished.", "continue"),
        ("Not complete.", "continue"),
        ("Continue.", "continue"),
        ("retry", "continue"),
        ("I give up: the API it needs does not exist.", "failed"),
        ("This is impossible without network access.", "failed"),
        ("This needs a human to decide which schema is right.", "escalate"),
        ("Escalating: the credentials are missing.", "escalate"),
        ("needs human", "escalate"),
        ("ask", "escalate"),
        ("FAILED", "failed"),
    ],
)
def test_parse_prose_verdict(text, verdict):
    assert parse(text).verdict == verdict


@pytest.mark.parametrize(
    "text",
    [
        "hmm",
        "Let me think about the next step and ask for help.",
        "The tests failed.",
        "The migration is complete but lint fails; continue.",
        "Verdict: done\nVerdict: continue",
        "{'unclosed': ",
        "42",
        "null",
        '"just a string"',
        "[1, 2, 3]",
    ],
)
def test_unclear_prose_escalates(text):
    result = parse(text)
    assert result.verdict == "escalate"
    assert NOT_UNDERSTOOD in result.reason


@pytest.mark.parametrize("text", ["", "   ", "\n\t\n"])
def test_empty_answer_escalates(text):
    result = parse(text)
    assert result.verdict == "escalate"
    assert NOT_UNDERSTOOD in result.reason
    assert "empty" in result.reason


def test_prose_labels_give_reason_and_next_instruction():
    text = (
        "Verdict: continue\nReason: one test still fails\nNext instruction: fix test_parse in tests/test_x.py"
    )
    assert parse(text) == Decision("continue", "one test still fails", "fix test_parse in tests/test_x.py")


def test_prose_without_reason_label_uses_the_text():
    assert parse("Done: everything passes.").reason == "Done: everything passes."


def test_negation_is_not_done():
    assert parse("The refactor is not done.").verdict == "continue"
    assert parse("The refactor is done.").verdict == "done"


# -- repetition --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recent", "verdict"),
    [
        ((), "continue"),
        (("fix the test",), "continue"),
        (("fix the test", "fix the test"), "failed"),
        (("Fix the test.", "other", "  FIX   the TEST!! "), "failed"),
        (("fix the test", "please fix the test again"), "failed"),
        (("fix the test on line 3", "fix the test on line 4"), "continue"),
        (("fix the test", "fix the test", "fix the test"), "failed"),
    ],
)
def test_instruction_already_given_twice_is_failed(recent, verdict):
    text = json.dumps({"verdict": "continue", "next_instruction": "Fix the test"})
    result = parse(text, recent_instructions=recent)
    assert result.verdict == verdict
    if verdict == "failed":
        assert "round in circles" in result.reason
        assert result.next_instruction == ""


def test_repeated_instruction_matters_only_for_continue():
    text = json.dumps({"verdict": "done", "next_instruction": "fix the test"})
    assert parse(text, recent_instructions=("fix the test",) * 3).verdict == "done"


@pytest.mark.parametrize(
    ("text", "degenerate"),
    [
        ("I will fix the test.\n" * 12, True),
        ("I will fix the test. " * 8, True),
        ("continue " * 10, True),
        ("fix it fix it fix it fix it fix it fix it", True),
        ("ab" * 40, True),
        ("I will fix the test.\n" * 4, False),
        ("Step one.\nStep two.\nStep three.\nStep four.\nStep five.", False),
        ("Ran the tests; two fail in test_parse.py. Fixing the import should help.", False),
        ("ok ok", False),
        ("", False),
        ("- run ruff\n- run mypy\n- run pytest\n- run ruff\n- write docs\n- run ruff\n- deploy", False),
    ],
)
def test_is_degenerate(text, degenerate):
    assert is_degenerate(text) is degenerate


def test_degenerate_prose_answer_is_failed():
    result = parse("I need to check the file.\n" * 30)
    assert result.verdict == "failed"
    assert "degenerate" in result.reason


def test_degenerate_prose_around_json_is_failed():
    result = parse("Checking again.\n" * 10 + '{"verdict": "continue", "next": "x"}')
    assert result.verdict == "failed"


def test_the_same_json_object_many_times_is_failed():
    result = parse('{"verdict": "continue", "next": "x"}\n' * 6)
    assert result.verdict == "failed"


def test_degenerate_next_instruction_is_failed():
    result = parse(json.dumps({"verdict": "continue", "next_instruction": "retry the build. " * 10}))
    assert result.verdict == "failed"


# -- caps --------------------------------------------------------------------------------------


def test_reason_and_instruction_are_capped():
    reason = " ".join(f"word{i}" for i in range(5_000))
    instruction = " ".join(f"step{i}" for i in range(5_000))
    result = parse(json.dumps({"verdict": "continue", "reason": reason, "next_instruction": instruction}))
    assert len(result.reason) <= MAX_REASON_CHARS
    assert len(result.next_instruction) <= MAX_INSTRUCTION_CHARS
    assert result.reason.startswith("word0 word1")
    assert result.reason.endswith("truncated]")


def test_huge_answer_is_read_by_head_and_tail():
    text = "x y z\n" * 100_000 + '{"verdict": "done", "reason": "end"}'
    assert parse(text).verdict in VERDICTS


def test_missing_reason_gets_a_default():
    assert parse('{"verdict": "failed"}').reason.strip()


# -- normalise ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Fix the test", "fix the test"),
        ("Fix   the\n\ttest", "fix the test"),
        ("Fix the test.", "fix the test"),
        ("Fix the test!!!", "fix the test"),
        ("**Fix** the `test`", "fix the test"),
        ("Please fix the test, thanks.", "fix the test"),
        ("Now fix the test again", "fix the test"),
        ("  fix the test  ", "fix the test"),
        ("Fix line 42", "fix line 42"),
    ],
)
def test_normalise_equal(a, b):
    assert normalise(a) == normalise(b) == b


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("fix line 42", "fix line 43"),
        ("fix the test", "fix the tests"),
        ("run ruff", "run mypy"),
    ],
)
def test_normalise_keeps_meaningful_differences(a, b):
    assert normalise(a) != normalise(b)


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_normalise_is_idempotent(text):
    assert normalise(normalise(text)) == normalise(text)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.from_regex(r"[A-Za-z0-9]{1,8}", fullmatch=True), min_size=1, max_size=6), st.data())
def test_normalise_ignores_case_spacing_and_punctuation(words, data):
    separators = data.draw(st.lists(st.sampled_from([" ", "  ", "\n", ", ", " - "]), min_size=len(words)))
    spaced = "".join(word + sep for word, sep in zip(words, separators, strict=False))
    assert normalise(spaced.upper() + "!") == normalise(" ".join(words).lower())


# -- properties of parse -----------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(), st.lists(st.text(max_size=20), max_size=4))
def test_parse_never_raises(text, recent):
    result = parse(text, recent_instructions=recent)
    assert result.verdict in VERDICTS
    assert result.reason.strip()
    assert len(result.reason) <= MAX_REASON_CHARS
    assert len(result.next_instruction) <= MAX_INSTRUCTION_CHARS
    if result.verdict in ("done", "failed"):
        assert result.next_instruction == ""


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet='{}[]":,` \njsonverdictdone', max_size=80) | _json_values.map(json.dumps))
def test_parse_never_raises_on_json_like_text(text):
    assert parse(text).verdict in VERDICTS


_SPELLINGS = {
    "done": ["done", "Complete", "FINISHED"],
    "failed": ["failed", "give up", "Fail"],
    "escalate": ["escalate", "needs human", "ASK"],
    "continue": ["continue", "next", "Retry"],
}


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(VERDICTS).flatmap(lambda v: st.tuples(st.just(v), st.sampled_from(_SPELLINGS[v]))),
    st.sampled_from(["verdict", "decision", "status", "action"]),
    st.text(max_size=300),
    st.text(max_size=300),
    st.sampled_from(["{}", "```json\n{}\n```", "My decision:\n{}\nThat is all.", "  {}  "]),
)
def test_json_with_a_valid_verdict_round_trips(verdict_and_spelling, key, reason, instruction, wrapper):
    verdict, spelling = verdict_and_spelling
    assume(not is_degenerate(instruction))
    payload = json.dumps({key: spelling, "reason": reason, "next_instruction": instruction})
    result = parse(wrapper.replace("{}", payload))
    assert result.verdict == verdict
    assert result.reason == (storable(reason.strip()) or result.reason)  # a NUL is kept as U+FFFD
    assert result.next_instruction == (storable(instruction.strip()) if verdict in ("continue", "escalate") else "")


# -- the `checks` decider ----------------------------------------------------------------------


def check(name, *, required=True, passed=True, output=""):
    return Check(name=name, required=required, passed=passed, output=output)


def test_from_checks_all_required_passed_is_done_and_leaves_naming_them_to_the_verdict():
    result = from_checks(
        [check("pytest"), check("ruff"), check("docs", required=False, passed=False)],
        act_ok=False,
        act_detail="",
    )
    # The policy's verdict names each required check once, with its evidence; the reason does not repeat them.
    assert (result.verdict, result.reason) == ("done", "all required checks passed")


@pytest.mark.parametrize(("act_ok", "verdict"), [(True, "done"), (False, "continue")])
def test_from_checks_without_checks_follows_the_act(act_ok, verdict):
    result = from_checks([], act_ok=act_ok, act_detail="exit status 2: boom")
    assert result.verdict == verdict
    if verdict == "continue":
        # The reason says what failed; the policy puts the failed act in front of the next instruction.
        assert "boom" in result.reason and result.next_instruction == ""


@pytest.mark.parametrize(
    ("detail", "shown"),
    [
        ("exit status 1: \x1b[31mOSError: disk full\x1b[0m", "exit status 1: OSError: disk full"),
        ("act timed out after 30s and was killed", "act timed out after 30s and was killed"),
        ("could not start 'agent': not found or not executable", "could not start 'agent'"),
        ("exit status 1: line one\r\nline two", "line one\nline two"),
        ("", "(it said nothing about why)"),
    ],
)
def test_act_failure_says_what_the_act_said(detail, shown):
    text = act_failure(detail)
    assert text.startswith("Your last act failed.") and shown in text
    assert "\x1b" not in text


def test_act_failure_keeps_the_tail_of_a_long_failure():
    text = act_failure("exit status 1: " + "x" * 10_000 + "\nthe last line")
    assert text.endswith("the last line") and "earlier characters omitted" in text
    assert len(text) < 2_300


@pytest.mark.parametrize(("act_ok", "verdict"), [(True, "done"), (False, "continue")])
def test_from_checks_with_only_optional_checks_follows_the_act(act_ok, verdict):
    result = from_checks(
        [check("docs", required=False, passed=False, output="missing")], act_ok=act_ok, act_detail="x"
    )
    assert result.verdict == verdict
    if verdict == "done":
        assert "docs" in result.reason
    else:
        assert "missing" in result.next_instruction


def test_from_checks_failing_required_continues_with_backpressure():
    checks = [
        check("ruff", required=False, passed=False, output="E501 line too long"),
        check("pytest", passed=False, output="FAILED tests/test_x.py::test_a - assert 1 == 2"),
        check("mypy", passed=True, output="Success"),
    ]
    result = from_checks(checks, act_ok=True, act_detail="")
    assert result.verdict == "continue"
    assert "pytest" in result.reason and "ruff" not in result.reason
    text = result.next_instruction
    assert "FAILED tests/test_x.py::test_a" in text and "E501" in text
    assert "mypy" not in text
    assert text.index("pytest") < text.index("ruff"), "required checks are listed first"
    assert text == backpressure(checks)


def test_backpressure_keeps_the_tail_of_long_output():
    output = "\n".join(f"line {i}" for i in range(2_000)) + "\nTHE REAL ERROR"
    text = backpressure([check("pytest", passed=False, output=output)])
    assert "THE REAL ERROR" in text
    assert "line 0\n" not in text
    assert "earlier characters omitted" in text
    assert len(text) < CHECK_OUTPUT_CHARS + 300


def test_backpressure_caps_the_total():
    checks = [check(f"check{i}", passed=False, output=f"error {i}\n" + "x" * 5_000) for i in range(10)]
    text = backpressure(checks)
    assert len(text) < CHECKS_OUTPUT_TOTAL_CHARS + 10 * 200
    assert all(f"check{i}" in text for i in range(10)), "every failing check is named"


def test_backpressure_lists_many_checks_compactly():
    checks = [check(f"c{i}", passed=False) for i in range(100)]
    text = backpressure(checks)
    assert "80 more failing checks" in text
    assert len(text) < 5_000


def test_backpressure_is_empty_when_nothing_fails():
    assert backpressure([check("pytest")]) == ""
    assert backpressure([]) == ""


def test_backpressure_of_empty_output():
    assert "(no output)" in backpressure([check("pytest", passed=False, output="")])


def test_backpressure_ignores_run_to_run_noise():
    first = check(
        "pytest",
        passed=False,
        output="\x1b[31m1 failed\x1b[0m in 0.23s at 0x7f3a2b1c9d40, 2025-01-01T10:00:00Z",
    )
    again = check(
        "pytest",
        passed=False,
        output="\x1b[31m1 failed\x1b[0m in 1.5s at 0x7f00deadbeef, 2025-06-30 23:59:59",
    )
    assert backpressure([first]) == backpressure([again])
    assert "\x1b" not in backpressure([first])


_checks = st.lists(
    st.builds(
        Check,
        name=st.sampled_from(["pytest", "ruff", "mypy", "build"]),
        required=st.booleans(),
        passed=st.booleans(),
        output=st.text(max_size=3_000),
    ),
    max_size=6,
)


# A failed act's detail, sometimes with the agent asking a person (`TETHER_ESCALATE:` on stderr).
_act_details = st.one_of(
    st.text(max_size=100),
    st.text(max_size=60).map(lambda said: f"exit status 3: {said}\nTETHER_ESCALATE: {said}"),
)


@settings(max_examples=100, deadline=None)
@given(_checks, st.booleans(), _act_details)
def test_from_checks_properties(checks, act_ok, act_detail):
    result = from_checks(checks, act_ok=act_ok, act_detail=act_detail)
    assert result == from_checks(list(checks), act_ok=act_ok, act_detail=act_detail)
    if not act_ok and decision.question(act_detail):
        # The agent asked a person: that wins over whatever the checks say.
        assert (result.verdict, result.reason, result.next_instruction) == (
            "escalate", decision.question(act_detail), ""
        )
        return
    required = [c for c in checks if c.required]
    if required:
        assert (result.verdict == "done") == all(c.passed for c in required)
    else:
        assert (result.verdict == "done") == act_ok
    assert result.verdict in ("done", "continue")
    assert result.reason.strip()
    if result.verdict == "continue":
        # The failing checks; a failed act is the policy's to put in front of them.
        assert result.next_instruction == backpressure(checks)
        assert result.next_instruction.strip() or not act_ok
        assert len(result.next_instruction) <= CHECKS_OUTPUT_TOTAL_CHARS + CHECK_OUTPUT_CHARS + 6 * 200
    else:
        assert result.next_instruction == ""


def test_module_has_no_django():
    assert "django" not in repr(vars(decision).keys())


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        '{"a":' * 100_000 + "1" + "}" * 100_000,
        'x {"verdict": ' + "[" * 100_000,
        '{"decision":' * 900 + '"done"' + "}" * 900,
    ],
)
def test_absurd_nesting_does_not_raise(text):
    assert parse(text).verdict in VERDICTS
