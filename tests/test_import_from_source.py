"""Importing te_async from a folder that holds its sources but no compiled modules (the repository
root, on a non-editable install) says what happened and what to do, instead of "circular import"."""

import pathlib
import shutil
import subprocess
import sys

import pytest

import te_async
from te_async import _ffi


def test_source_folder_without_compiled_modules(tmp_path):
    package = pathlib.Path(te_async.__file__).parent
    if pathlib.Path(_ffi._te_async_cpu.__file__).parent != package:
        pytest.skip("an editable install: its import hook finds the compiled modules from any folder")
    shutil.copytree(package, tmp_path / "te_async", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    proc = subprocess.run([sys.executable, "-c", "import te_async"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "compiled modules are missing" in proc.stderr and "python -P" in proc.stderr, proc.stderr[-2000:]
