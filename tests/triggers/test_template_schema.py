"""The API document's pattern for an objective template takes exactly what the parser takes."""

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from loops.objective_template import TemplateError, fields
from triggers.schemas import TEMPLATE_PATTERN

PATTERN = re.compile(TEMPLATE_PATTERN)


def parses(template):
    try:
        fields(template)
    except TemplateError:
        return False
    return bool(template.strip())


def test_known_cases_agree():
    for case in [
        "{a}",
        "{{a}}",
        "{{{a}}}",
        "{a}}",
        "{{a}",
        "  ",
        " {a} ",
        "{_a}",
        "{__a}",
        "{a._}",
        "{a.__b}",
        "x{a.0.b}y",
        "{}",
        "}",
        "{",
        "{ }",
        "\u00a0",
        "Triage #{issue.number}: {issue.title}\n\n{issue.body}",
    ]:
        assert bool(PATTERN.fullmatch(case)) == parses(case), case


@settings(max_examples=2000)
@given(st.text(alphabet="{}_a.-0 \t\n!:[", max_size=14))
def test_any_text_is_taken_by_both_or_by_neither(template):
    assert bool(PATTERN.fullmatch(template)) == parses(template)


@settings(max_examples=300)
@given(st.from_regex(TEMPLATE_PATTERN, fullmatch=True))
def test_what_the_pattern_generates_parses(template):
    assert parses(template)
