# -*- Python -*-
# lit configuration for StageML's IR tests (after LLVM mlir/examples/standalone).
#
#   PATH=.venv/bin:$PATH lit -v lit_tests      (lit 23 has no `python -m lit`)
#
# Every test is a .mlir file whose RUN lines pipe `stageml-opt` into
# `filecheck` (the Python port of LLVM FileCheck).

import os
import re

import lit.formats
import lit.util

config.name = "StageML"
config.test_format = lit.formats.ShTest(execute_external=False)  # lit's portable shell
config.suffixes = [".mlir"]
config.excludes = ["Output", "lit.cfg.py"]

config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = config.test_source_root  # Output/ dirs land next to the tests

# The tools are console scripts of the project's virtualenv; prefer it over
# whatever else is on PATH.
repo_root = os.path.dirname(config.test_source_root)
venv_bin = os.path.join(repo_root, ".venv", "bin")
if os.path.isdir(venv_bin):
    config.environment["PATH"] = os.pathsep.join([venv_bin, config.environment["PATH"]])

for tool in ("stageml-opt", "filecheck"):
    path = lit.util.which(tool, config.environment["PATH"])
    if path is None:
        lit_config.fatal(f"{tool} not found: run `make test` (it installs .venv) or put it on PATH")
    # A tool name as a word of a RUN line (not part of a path or a longer name).
    config.substitutions.append((r"(?<![\w./-])" + re.escape(tool) + r"(?![\w.-])", path))
