"""Run by Python at start-up in a check (its directory is the check's PYTHONPATH, outside the workspace).

Checks run in safe-path mode (`PYTHONSAFEPATH`): the workspace is not put first on `sys.path`, so
a `pytest.pyc`, `pluggy.py` or `argparse.py` an agent wrote cannot stand in for the runner or the
standard library. The workspace still has to be importable (the code under test lives there), so
it goes last: after the standard library and the installed packages.
"""

import os
import sys

if os.environ.get("PYTHONSAFEPATH") and os.getcwd() not in sys.path:
    sys.path.append(os.getcwd())
