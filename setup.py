"""The one thing pyproject.toml cannot say: the package list.

The repository root is the `stageml` package (package-dir {"stageml": "."}).
setuptools' `packages.find` names what it finds relative to `where`
(`compiler`, not `stageml.compiler`), and leaving `packages` out finds every
directory below the root, tests/ included. So the packages are `stageml` and
every directory below the root with an __init__.py, outside NOT_SHIPPED; all
else is in pyproject.toml.
"""

import pathlib

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

NOT_SHIPPED = ("tests", "benchmarks", "examples", "lit_tests", "build", "out")

ROOT = pathlib.Path(__file__).resolve().parent
EXCLUDE = [pattern for name in NOT_SHIPPED for pattern in (name, f"{name}.*")]


class BuildPy(build_py):
    """build_py, less this file (it sits in the `stageml` package's directory)."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if pathlib.Path(m[2]).resolve() != pathlib.Path(__file__).resolve()]


setup(
    packages=["stageml", *(f"stageml.{name}" for name in find_packages(ROOT, exclude=EXCLUDE))],
    cmdclass={"build_py": BuildPy},
)
