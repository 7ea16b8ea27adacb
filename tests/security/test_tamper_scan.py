"""Code under test that tampers with the test machinery is seen in the diff (issue #24, point 3).

`loops.tamper.scan(before, after)` is pure: each test hands it file contents and reads the
findings. Every way in the issue is flagged on its own line; honest code (a calc module, a
command-line program, a function that exits) is not; a finding already in `before` is not
reported again; a file that does not parse is read with patterns.
"""

import dataclasses
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loops import tamper
from loops.tamper import MAX_FILE_BYTES, MAX_FINDINGS, Finding, is_test_path, scan


def src(text: str) -> bytes:
    return textwrap.dedent(text).lstrip("\n").encode()


def found(after: str, before: str | None = None, path: str = "calc.py") -> list[tuple[int, str]]:
    findings = scan({path: None if before is None else src(before)}, {path: src(after)})
    for finding in findings:
        assert finding.path == path
        assert finding.text == src(after).decode().splitlines()[finding.line - 1].rstrip()
    return [(finding.line, finding.what) for finding in findings]


# (source, line, what): each is the one new tampering line in an otherwise honest module.
TAMPERING = {
    "os._exit": ("import os\n\ndef add(a, b):\n    return a + b\n\nos._exit(0)\n", 6, "calls os._exit"),
    "os._exit in a function": ("import os\n\ndef add(a, b):\n    os._exit(0)\n", 4, "calls os._exit"),
    "import os as o": ("import os as o\no._exit(0)\n", 2, "calls os._exit"),
    "from os import _exit": ("from os import _exit as leave\n\nleave(0)\n", 3, "calls os._exit"),
    "__import__('os')._exit": ("__import__('os')._exit(0)\n", 1, "calls os._exit"),
    "getattr(os, '_exit')": ("import os\ngetattr(os, '_exit')(0)\n", 2, "calls os._exit"),
    "getattr with a joined name": ("import os\nquit_now = getattr(os, '_ex' + 'it')\n", 2, "refers to os._exit"),
    "importlib.import_module": ("import importlib\nimportlib.import_module('os')._exit(0)\n", 2, "calls os._exit"),
    "sys.modules['os']._exit": ("import sys\nsys.modules['os']._exit(0)\n", 2, "calls os._exit"),
    "os._exit handed to a signal": (
        "import os, signal\nsignal.signal(signal.SIGTERM, lambda *_: os._exit(0))\n", 2, "calls os._exit"),
    "os.execv": ("import os\nos.execv('/bin/true', ['true'])\n", 2, "calls os.execv"),
    "exec of a literal": ("exec('import os as q; q._exit(0)')\n", 1, "calls os._exit (in exec)"),
    "sys.exit at import": ("import sys\n\nVALUE = 1\nsys.exit(0)\n", 4, "calls sys.exit at import"),
    "sys.exit() at import": ("import sys\nsys.exit()\n", 2, "calls sys.exit at import"),
    "from sys import exit": ("from sys import exit as done\ndone()\n", 2, "calls sys.exit at import"),
    "exit() at import": ("exit()\n", 1, "calls exit at import"),
    "sys.exit in a class body": ("import sys\n\nclass Calc:\n    sys.exit(0)\n", 4, "calls sys.exit at import"),
    "sys.exit in a __main__ guard's else": (
        "import sys\nif __name__ == '__main__':\n    pass\nelse:\n    sys.exit(0)\n", 5, "calls sys.exit at import"),
    "raise SystemExit at import": ("raise SystemExit\n", 1, "raises SystemExit at import"),
    "raise SystemExit(0) at import": ("raise SystemExit(0)\n", 1, "raises SystemExit at import"),
    "atexit.register": ("import atexit, os\natexit.register(os.getpid)\n", 2, "uses atexit.register"),
    "atexit.register in a function": (
        "import atexit\n\ndef setup():\n    atexit.register(print)\n", 4, "uses atexit.register"),
    "@atexit.register": ("import atexit\n\n@atexit.register\ndef bye():\n    pass\n", 3, "uses atexit.register"),
    "from atexit import register": ("from atexit import register\n", 1, "imports atexit.register"),
    "unittest.TestCase.assertEqual =": (
        "import unittest\n\nunittest.TestCase.assertEqual = lambda *a, **k: None\n",
        3, "patches unittest.TestCase.assertEqual"),
    "from unittest import TestCase": (
        "from unittest import TestCase\nTestCase.assertTrue = lambda *a, **k: None\n",
        2, "patches unittest.TestCase.assertTrue"),
    "an alias of TestCase": (
        "import unittest\nT = unittest.TestCase\nT.assertEqual = print\n", 3, "patches unittest.TestCase.assertEqual"),
    "sys.modules['unittest'].TestCase": (
        "import sys\nsys.modules['unittest'].TestCase.assertEqual = print\n",
        2, "patches unittest.TestCase.assertEqual"),
    "setattr(unittest.TestCase, ...)": (
        "import unittest\nsetattr(unittest.TestCase, 'assertEqual', print)\n",
        2, "patches unittest.TestCase.assertEqual"),
    "del unittest.TestCase.assertEqual": (
        "import unittest\ndel unittest.TestCase.assertEqual\n", 2, "deletes unittest.TestCase.assertEqual"),
    "builtins.AssertionError =": (
        "import builtins\nbuiltins.AssertionError = Exception\n", 2, "patches builtins.AssertionError"),
    "__builtins__['AssertionError']": (
        "__builtins__['AssertionError'] = Exception\n", 1, "patches builtins.AssertionError"),
    "vars(builtins)[...]": (
        "import builtins\nvars(builtins)['AssertionError'] = Exception\n", 2, "patches builtins.AssertionError"),
    "setattr(builtins, ...)": (
        "import builtins as b\nsetattr(b, 'AssertionError', Exception)\n", 2, "patches builtins.AssertionError"),
    "pytest internals": (
        "import _pytest.assertion.util as u\nu._reprcompare = None\n", 2, "patches _pytest.assertion.util._reprcompare"),
    "pytest.approx =": ("import pytest\npytest.approx = lambda x, **k: x\n", 2, "patches pytest.approx"),
    "mock.patch('unittest...')": (
        "from unittest import mock\nmock.patch('unittest.TestCase.assertEqual').start()\n",
        2, "patches unittest.TestCase.assertEqual (mock.patch)"),
    "mock.patch.object(unittest.TestCase, ...)": (
        "import unittest\nfrom unittest.mock import patch\npatch.object(unittest.TestCase, 'assertEqual').start()\n",
        3, "patches unittest.TestCase.assertEqual (mock.patch.object)"),
    "sys.modules['pytest'] =": ("import sys\nsys.modules['pytest'] = object()\n", 2, "writes sys.modules['pytest']"),
    "sys.modules['_pytest...'] =": (
        "import sys\nsys.modules['_pytest.main'] = object()\n", 2, "writes sys.modules['_pytest.main']"),
    "sys.modules['pluggy'] =": ("import sys\nsys.modules['pluggy'] = object()\n", 2, "writes sys.modules['pluggy']"),
    "sys.modules['unittest'] =": (
        "import sys as s\ns.modules['unittest'] = object()\n", 2, "writes sys.modules['unittest']"),
    "sys.modules.setdefault": (
        "import sys\nsys.modules.setdefault('pytest', object())\n", 2, "writes sys.modules['pytest']"),
    "sys.modules.update": ("import sys\nsys.modules.update({'pytest': None})\n", 2, "writes sys.modules (update)"),
    "del sys.modules[...]": ("import sys\ndel sys.modules['pluggy']\n", 2, "deletes sys.modules['pluggy']"),
    "sys.meta_path.insert": ("import sys\nsys.meta_path.insert(0, object())\n", 2, "modifies sys.meta_path"),
    "pytest.exit": ("import pytest\n\ndef add(a, b):\n    pytest.exit('ok', returncode=0)\n", 4, "calls pytest.exit"),
    "pytest.skip at import": (
        "import pytest\npytest.skip('later', allow_module_level=True)\n", 2, "calls pytest.skip at import"),
    "raise unittest.SkipTest": ("import unittest\nraise unittest.SkipTest('later')\n", 2,
                                "raises unittest.SkipTest at import"),
}


@pytest.mark.parametrize("source, line, what", TAMPERING.values(), ids=TAMPERING.keys())
def test_each_way_of_tampering_is_flagged_on_its_line(source: str, line: int, what: str) -> None:
    assert (line, what) in found(source)


@pytest.mark.parametrize("source, line, what", TAMPERING.values(), ids=TAMPERING.keys())
def test_each_way_of_tampering_is_flagged_when_added_to_an_existing_file(source: str, line: int, what: str) -> None:
    honest = "def add(a, b):\n    return a + b\n"
    after = honest + "\n" + source
    offset = honest.count("\n") + 1
    assert (line + offset, what) in found(after, before=honest)


def test_a_finding_carries_its_path_line_and_text() -> None:
    findings = scan({}, {"pkg/calc.py": b"import os\n\n    \nos._exit(0)  \n"})
    assert findings == [Finding("pkg/calc.py", 4, "os._exit(0)", "calls os._exit")]
    with pytest.raises(dataclasses.FrozenInstanceError):
        findings[0].line = 1  # type: ignore[misc]


HONEST = {
    "calc module": """
        import math

        def add(a, b):
            return a + b

        def hypot(a, b):
            return math.sqrt(a * a + b * b)
        """,
    "command-line program": """
        import argparse
        import sys

        def main(argv=None):
            parser = argparse.ArgumentParser()
            parser.add_argument("n", type=int)
            args = parser.parse_args(argv)
            print(args.n * 2)
            return 0

        if __name__ == "__main__":
            sys.exit(main())
        """,
    "reversed __main__ guard": """
        import sys
        if "__main__" == __name__:
            raise SystemExit(0)
        """,
    "function that exits": """
        import sys

        def fail(message):
            print(message, file=sys.stderr)
            sys.exit(2)

        def done():
            raise SystemExit(0)

        stop = lambda: sys.exit(0)
        """,
    "a missing dependency ends the import with an error": """
        import sys
        try:
            import requests
        except ImportError:
            sys.exit("this program needs requests")
        if sys.version_info < (3, 10):
            sys.exit(1)
        """,
    "lazy module replacing itself": """
        import sys
        import types

        class _Lazy(types.ModuleType):
            pass

        sys.modules[__name__].__class__ = _Lazy
        sys.modules[__name__] = _Lazy(__name__)
        """,
    "a TestCase base class for a test helper": """
        import unittest

        class CalcCase(unittest.TestCase):
            maxDiff = None

            def assertClose(self, a, b):
                self.assertAlmostEqual(a, b, places=6)
        """,
    "names that only look like modules": """
        class Job:
            @property
            def atexit(self):
                return self._atexit

            @atexit.setter
            def atexit(self, value):
                self._atexit = value

        def run(mock, os):
            mock.child = 1
            os._exit = None
            return mock

        exit_code = 0
        """,
    "reading sys.modules and os": """
        import os
        import sys

        calc = sys.modules.get("calc")
        HOME = os.environ.get("HOME")
        os.makedirs("out", exist_ok=True)
        """,
}


@pytest.mark.parametrize("source", HONEST.values(), ids=HONEST.keys())
def test_honest_code_is_not_flagged(source: str) -> None:
    assert found(source) == []


def test_a_packages_main_module_may_exit_at_its_top_level() -> None:
    after = {"cli/__main__.py": src("import sys\nfrom cli import main\nsys.exit(main())\n")}
    assert scan({}, after) == []
    assert scan({}, {"cli/__init__.py": after["cli/__main__.py"]}) != []


def test_an_unchanged_finding_is_not_reported_again() -> None:
    before = "import atexit, os\n\ndef add(a, b):\n    return a - b\n\natexit.register(os.getpid)\n"
    after = "import atexit, os\n\n# fixed\ndef add(a, b):\n    return a + b\n\natexit.register(os.getpid)\n"
    assert found(before) == [(6, "uses atexit.register")]
    assert found(after, before=before) == []


def test_a_repeated_line_is_reported_where_it_was_added() -> None:
    before = "import os\n\ndef stop():\n    os._exit(0)\n"
    after = "import os\n\nos._exit(0)\n\ndef stop():\n    os._exit(0)\n"
    assert found(after, before=before) == [(3, "calls os._exit")]
    after = "import os\n\ndef stop():\n    os._exit(0)\n\ndef halt():\n    os._exit(0)\n"
    assert found(after, before=before) == [(7, "calls os._exit")]


def test_moving_an_exit_to_import_time_is_new() -> None:
    before = "import sys\n\ndef main():\n    sys.exit(0)\n"
    dedented = "import sys\n\nsys.exit(0)\n"
    assert found(dedented, before=before) == [(3, "calls sys.exit at import")]
    # The line reads the same, but a class body runs at import where a function body did not.
    in_class = "import sys\n\nclass main:\n    sys.exit(0)\n"
    assert found(in_class, before=before) == [(4, "calls sys.exit at import")]


def test_a_changed_alias_makes_an_old_line_new() -> None:
    before = "import posixpath as o\no._exit(0)\n"
    after = "import os as o\no._exit(0)\n"
    assert found(before) == []
    assert found(after, before=before) == [(2, "calls os._exit")]


def test_removed_deleted_and_identical_files_give_nothing() -> None:
    tampering = src("import os\nos._exit(0)\n")
    assert scan({"calc.py": tampering}, {"calc.py": None}) == []
    assert scan({"calc.py": tampering}, {}) == []
    assert scan({"calc.py": tampering}, {"calc.py": tampering}) == []
    honest = src("def add(a, b):\n    return a + b\n")
    assert scan({"calc.py": tampering}, {"calc.py": honest}) == []


def test_a_file_that_does_not_parse_is_read_with_patterns() -> None:
    broken = src("""
        import os, sys, unittest
        def add(a, b:
            return a + b
        os._exit(0)
        sys.exit(0)
        unittest.TestCase.assertEqual = lambda *a: None
        sys.modules['pytest'] = None
        setattr(unittest.TestCase, 'assertTrue', print)
        import atexit; atexit.register(print)
        """)
    findings = [(f.line, f.what) for f in scan({}, {"calc.py": broken})]
    assert (4, "mentions os._exit (file does not parse)") in findings
    assert (5, "calls sys.exit at import (file does not parse)") in findings
    assert (6, "patches unittest.TestCase.assertEqual (file does not parse)") in findings
    assert (7, "writes sys.modules['pytest'] (file does not parse)") in findings
    assert (8, "patches unittest.TestCase (setattr) (file does not parse)") in findings
    assert (9, "mentions atexit (file does not parse)") in findings
    assert not any(line in (1, 2, 3) for line, _ in findings)


def test_an_unparsable_file_reports_only_its_new_lines() -> None:
    before = src("def add(a, b:\n    return a + b\nimport os; os._exit(0)\n")
    after = src("def add(a, b:\n    return a - b\nimport os; os._exit(0)\nsys.exit()\n")
    findings = scan({"calc.py": before}, {"calc.py": after})
    assert [(f.line, f.what) for f in findings] == [(4, "calls sys.exit at import (file does not parse)")]


def test_test_files_and_other_files_are_out_of_scope_by_default() -> None:
    tampering = src("import os\nos._exit(0)\n")
    skipped = ["test_calc.py", "calc_test.py", "conftest.py", "tests/helpers.py", "pkg/test/util.py",
               "README.md", "setup.cfg"]
    assert scan({}, dict.fromkeys(skipped, tampering)) == []
    assert all(is_test_path(path) for path in skipped[:5])
    assert not is_test_path("calc.py") and not is_test_path("testing.py") and not is_test_path("contest.py")
    assert [f.path for f in scan({}, {"tests/helpers.py": tampering}, include=lambda path: True)] == [
        "tests/helpers.py"
    ]


def test_findings_are_ordered_by_path_then_line() -> None:
    after = {
        "b.py": src("import os\nos._exit(0)\n"),
        "a.py": src("import sys\nimport os\nos._exit(1)\nsys.modules['pytest'] = 1\n"),
    }
    assert [(f.path, f.line) for f in scan({}, after)] == [("a.py", 3), ("a.py", 4), ("b.py", 2)]


def test_string_content_is_accepted() -> None:
    assert scan({}, {"calc.py": "import os\nos._exit(0)\n"}) == [
        Finding("calc.py", 2, "os._exit(0)", "calls os._exit")
    ]


def test_bounds() -> None:
    huge = b"import os\n" + b"x = 1\n" * (MAX_FILE_BYTES // 6 + 1)
    assert scan({}, {"big.py": huge}) == [Finding("big.py", 0, "", f"not scanned: larger than {MAX_FILE_BYTES:,} bytes")]
    many = ("import os\n" + "os._exit(0)\n" * (MAX_FINDINGS * 3)).encode()
    assert len(scan({}, {"a.py": many, "b.py": many})) == MAX_FINDINGS
    # A long file (read with patterns only) is still read.
    long = b"x = 1\n" * (tamper.MAX_PARSE_BYTES // 6 + 1) + b"import os\nos._exit(0)\n"
    assert [f.what for f in scan({}, {"long.py": long})] == ["mentions os._exit (file does not parse)"]


def test_a_deeply_nested_file_falls_back_to_patterns() -> None:
    deep = ("import os\nx = " + "a." * 5000 + "b\nos._exit(0)\n").encode()
    assert [f.line for f in scan({}, {"deep.py": deep})] == [3]


PYTHONISH = st.lists(
    st.sampled_from([
        "import os", "import sys as s", "from os import _exit", "os._exit(0)", "s.exit()", "sys.exit(0)",
        "if __name__ == '__main__':", "def f(a):", "class C:", "    ", "\n", "(", ")", "[", "]", "'", '"',
        "unittest.TestCase.assertEqual = 1", "sys.modules['pytest'] = x", "setattr(builtins, 'x', 1)",
        "exec('import os; os._exit(0)')", "getattr(os, '_exit')", "__import__('os')", "atexit.register(f)",
        "\\", "#", "\t", "\r", "\x00", "\ufeff", "# -*- coding: latin-1 -*-", "lambda: ", "raise SystemExit",
    ]),
    max_size=40,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(before=st.one_of(st.none(), st.text(), st.binary(), PYTHONISH), after=st.one_of(st.text(), st.binary(), PYTHONISH))
def test_scan_never_raises(before: str | bytes | None, after: str | bytes) -> None:
    findings = scan({"calc.py": before}, {"calc.py": after})
    assert len(findings) <= MAX_FINDINGS
    assert all(isinstance(f, Finding) and f.path == "calc.py" and f.line >= 0 for f in findings)


def test_many_old_findings_do_not_hide_a_new_one() -> None:
    before = "import atexit\n" + "atexit.register(print)\n" * 500
    after = before + "import os\nos._exit(0)\n"
    assert found(after, before=before) == [(503, "calls os._exit")]
