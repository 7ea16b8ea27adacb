"""An import inside a function says why it is not at the top of its module (`# lazy: <reason>`).

Module level is the rule; a function-level import is kept only for a real cycle or a real
laziness (an SDK only some agents load, the app registry before `ready()`), and says which. An
optional SDK is loaded through one cached function (`tether.tracing._otel`,
`instances.tools.mcp._sdk`); an app's `ready()` imports one `receivers` module. The whole tree
holds at most MAX_FUNCTION_IMPORTS of them.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

from scripts.house import ROOT, app_files, function_imports

COVERED = app_files()
MAX_FUNCTION_IMPORTS = 40  # 56 before issue #28


def untagged(path: Path, root: Path = ROOT) -> list[str]:
    """Each function-level import of `path` whose lines carry no `# lazy:` comment."""
    lines = path.read_text().splitlines()
    found = []
    for function in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import | ast.ImportFrom):
                said = lines[node.lineno - 1 : (node.end_lineno or node.lineno)]
                if not any("# lazy: " in line for line in said):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_every_function_level_import_says_why_it_is_lazy():
    assert len(COVERED) > 150
    assert ROOT / "web" / "management" / "commands" / "serve.py" in COVERED
    assert [line for path in COVERED for line in untagged(path)] == []


def test_the_tree_holds_few_function_level_imports():
    found = [line for path in COVERED for line in function_imports(path)]
    assert len(found) <= MAX_FUNCTION_IMPORTS, "\n".join([f"{len(found)} > {MAX_FUNCTION_IMPORTS}:", *found])


def test_the_optional_sdks_stay_unloaded_until_used(tmp_path):
    """A process with tracing off and no MCP act loads neither OpenTelemetry nor the mcp SDK."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(DJANGO_SETTINGS_MODULE="tether.settings", TETHER_HOME=str(tmp_path))
    program = (
        "import sys, django; django.setup()\n"
        "import tether.urls, tether.tracing, instances.tools.mcp, loops.runner\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'opentelemetry', 'mcp', 'anyio'}))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_scan_sees_an_untagged_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    import json  # lazy: a reason\n    import os\n    return json, os\n")
    assert untagged(sample, tmp_path) == ["sample.py:3: import os"]


def test_the_count_sees_each_function_level_import_once(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import re\n\ndef f():\n    import json\n    def g():\n        import os\n    return json, re, g\n")
    assert function_imports(sample, tmp_path) == ["sample.py:4: import json", "sample.py:6: import os"]
