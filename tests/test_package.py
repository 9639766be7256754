"""One import name: an install puts ``zerotune`` (and nothing called ``api``, ``db``, ``tuner``, ``core`` ...)
into a user's environment, with its data files and the ``zerotune`` console script."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support import ROOT


def test_the_wheel_holds_one_top_level_package(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy: setuptools builds in the source tree, which must stay clean
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", "tests", "bench"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "--wheel-dir", str(tmp_path), str(source)], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("zerotune-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"zerotune", wheel.name.split("-py")[0] + ".dist-info"}
    for part in ("core", "costmodel", "trainer", "tuner", "api", "db"):  # the layers are all in, under the one name
        assert f"zerotune/{part}/__init__.py" in names, part
    for data in ("zerotune/costmodel/model_error.json", "zerotune/costmodel/rebased.json",
                 "zerotune/api/dashboard/static/dashboard.js",
                 "zerotune/api/dashboard/templates/base.html", "zerotune/db/migrations/versions/0001_initial.py"):
        assert data in names, data
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "zerotune = zerotune.api.cli:main" in entry


def test_only_zerotune_is_importable_outside_the_checkout(tmp_path: Path) -> None:
    """The installed environment, seen from a directory that is not the repository."""
    def imports(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, cwd=tmp_path,
                              timeout=120)
    for name in ("api", "db", "tuner", "core", "costmodel", "trainer", "strategies"):
        result = imports(name)
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, name
    for name in ("zerotune.core.spec", "zerotune.costmodel", "zerotune.api.prologue", "zerotune.db.models"):
        result = imports(name)
        assert result.returncode == 0, result.stderr
    script = shutil.which("zerotune", path=str(Path(sys.executable).parent))
    assert script is not None, "the zerotune console script is installed beside this interpreter"
    result = subprocess.run([script, "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0 and "usage: zerotune" in result.stdout, result.stderr
