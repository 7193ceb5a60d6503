"""`pip install ./sdk/python` works: the package builds as a wheel holding every module
and `py.typed`, and the installed copy imports on its own."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_builds_installs_and_imports_from_its_wheel(tmp_path: Path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(source)], check=True)
    [wheel] = (tmp_path / "dist").glob("warren_sdk-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("__init__.py", "_generated.py", "_transport.py", "client.py", "py.typed",
                   "deepagents/__init__.py", "openai_agents/__init__.py"):
        assert f"warren_sdk/{module}" in names, module
    target = tmp_path / "installed"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                    str(wheel)], check=True)
    imported = subprocess.run(
        [sys.executable, "-I", "-c",
         f"import sys; sys.path.insert(0, {str(target)!r}); import warren_sdk; "
         "print(warren_sdk.__file__, len(warren_sdk.OPERATIONS))"],
        check=True, capture_output=True, text=True).stdout
    assert imported.startswith(str(target)) and int(imported.split()[1]) > 60
