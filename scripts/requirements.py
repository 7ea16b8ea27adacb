"""Print the project's dependencies from pyproject.toml (with extras named on the command line)."""

import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
print("\n".join(project["dependencies"]))
for extra in sys.argv[1:]:
    print("\n".join(project["optional-dependencies"][extra]))
