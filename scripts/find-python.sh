#!/usr/bin/env bash
# Print the path of a Python >= 3.12 interpreter, or explain what is needed and fail.
# pyenv shims may exist for versions that are not selected (and then refuse to run),
# so every candidate is tried, not just looked up.
set -u
ok() { "$1" -c 'import sys, venv; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }
candidates=("${PYTHON:-}" python3.13 python3.12 python3)
roots=("${PYENV_ROOT:-}" "$HOME/.pyenv" /root/.pyenv /opt/pyenv)
for root in "${roots[@]}"; do
  [ -n "$root" ] && [ -d "$root/versions" ] || continue
  for v in $(ls -1 "$root/versions" 2>/dev/null | grep -E '^3\.(1[2-9]|[2-9][0-9])' | sort -rV); do
    candidates+=("$root/versions/$v/bin/python3")
  done
done
candidates+=(/usr/local/bin/python3.13 /usr/local/bin/python3.12 /usr/bin/python3.13 /usr/bin/python3.12)
for c in "${candidates[@]}"; do
  [ -n "$c" ] || continue
  path=$(command -v "$c" 2>/dev/null) || continue
  if ok "$path"; then echo "$path"; exit 0; fi
done
echo "Tether needs Python 3.12 or newer (with the venv module), and none was found." >&2
echo "Install one (e.g. 'apt-get install python3.12 python3.12-venv' or 'pyenv install 3.12')," >&2
echo "or point PYTHON at it: make run PYTHON=/path/to/python3.12" >&2
exit 1
