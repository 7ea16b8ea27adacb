"""Objective templates fill in paths of a JSON payload and nothing else."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loops.objective_template import TemplateError, fields, render

ISSUE = {
    "action": "opened",
    "issue": {
        "number": 42,
        "title": "Crash on start",
        "body": None,
        "labels": [{"name": "bug"}, {"name": "p1"}],
        "locked": False,
    },
    "repository": {"full_name": "octo/hello"},
}


def test_dotted_paths_fill_keys_and_list_indexes():
    out = render(
        "Triage issue #{issue.number} in {repository.full_name}: {issue.title} [{issue.labels.1.name}]",
        ISSUE,
        max_chars=1000,
    )
    assert out == "Triage issue #42 in octo/hello: Crash on start [p1]"


def test_values_are_written_as_json_writes_them_and_null_as_nothing():
    assert render("{issue.locked}|{issue.body}|{issue.number}", ISSUE, max_chars=100) == "false||42"
    assert render("{issue.labels.0}", ISSUE, max_chars=100) == '{"name": "bug"}'


def test_double_braces_are_literal_braces():
    assert render("{{not a field}} {action}", ISSUE, max_chars=100) == "{not a field} opened"


def test_schedule_fields_are_plain_data_too():
    data = {"date": "2026-12-06", "last_run": {"id": 9, "outcome": "done"}}
    assert render("Daily check {date} (last: {last_run.outcome})", data, max_chars=100) == (
        "Daily check 2026-12-06 (last: done)"
    )


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{__class__}", "names starting with '__' are not looked up"),
        ("{issue.__class__.__init__.__globals__}", "names starting with '__'"),
        ("{0.__class__}", "names starting with '__'"),
        ("{issue.title!r}", "conversions like !r or !s are not allowed"),
        ("{issue.title!s:>10}", "conversions"),
        ("{issue.title:>99999}", "format specifications (after ':') are not allowed"),
        ("{issue.title:{issue.number}}", "fields do not nest"),
        ("{issue[title]}", "a dotted path of keys and list indexes"),
        ("{issue.title()}", "a dotted path of keys and list indexes"),
        ("{issue title}", "a dotted path of keys and list indexes"),
        ("{}", "an empty field"),
        ("{issue.title", "never closed"),
        ("issue}", "a lone '}'"),
    ],
)
def test_tricks_are_refused_with_a_clear_message(template, says):
    with pytest.raises(TemplateError) as refused:
        render(template, ISSUE, max_chars=100_000)
    assert says in refused.value.message
    with pytest.raises(TemplateError):
        fields(template)  # refused when the template is saved, too


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{issue.nubmer}", "issue has no key 'nubmer'"),
        ("{pull_request.title}", "the payload has no key 'pull_request'"),
        ("{issue.labels.5.name}", "issue.labels is a list of 2; '5' is not an index in it"),
        ("{issue.labels.name}", "'name' is not an index"),
        ("{issue.title.length}", "issue.title is text, not an object or a list"),
        ("{issue.body.text}", "issue.body is null"),
    ],
)
def test_a_path_not_in_the_payload_is_refused(template, says):
    with pytest.raises(TemplateError) as refused:
        render(template, ISSUE, max_chars=1000)
    assert says in refused.value.message


def test_a_key_that_looks_like_an_attribute_is_only_a_key():
    # `format`, `keys`, `items` are dict methods in Python; here they are only keys of the payload.
    assert render("{items}-{keys}", {"items": 1, "keys": 2}, max_chars=10) == "1-2"
    with pytest.raises(TemplateError, match="has no key 'keys'"):
        render("{keys}", {}, max_chars=10)


def test_the_result_is_capped_and_a_huge_field_is_refused_not_built():
    data = {"body": "x" * 5_000_000}
    with pytest.raises(TemplateError) as refused:
        render("Fix: {body}", data, max_chars=8000)
    assert "longer than 8,000 characters" in refused.value.message and "{body}" in refused.value.message
    assert render("Fix: {body}", {"body": "x" * 7995}, max_chars=8000) == "Fix: " + "x" * 7995
    with pytest.raises(TemplateError, match="longer than 8,000"):
        render("Fix: {body}", {"body": "x" * 7996}, max_chars=8000)


def test_a_crlf_counts_as_one_character_as_everywhere_else():
    assert render("{b}", {"b": "a\r\nb"}, max_chars=3) == "a\nb"


def test_fields_lists_each_path_once():
    assert fields("{a.b} {c} {a.b} {{d}}") == ["a.b", "c"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@given(template=st.text(max_size=60), data=JSON)
def test_any_template_on_any_payload_is_filled_or_refused_never_crashes(template, data):
    try:
        out = render(template, data, max_chars=500)
    except TemplateError as refused:
        assert refused.message
    else:
        assert len(out) <= 500
        json.dumps(out)
