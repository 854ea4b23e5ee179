import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parents[1] / "benchmarks"))  # workloads: models and inputs shared with the benchmarks


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: runs StageML's kernels on a CUDA (Hopper) GPU; skipped without one "
                                       "(`pytest -m gpu tests/test_kernels_gpu.py`)")
    config.addinivalue_line("markers", "sweep: the architecture sweep's families beyond its fast set; not in the "
                                       "default run (`make sweep`)")


def pytest_runtest_logreport(report):
    """With STAGEML_SWEEP_LOG set, each architecture-sweep test's outcome (and its error's last
    line) is appended to that file as it ends: `make sweep` writes out/sweep.jsonl."""
    path = os.environ.get("STAGEML_SWEEP_LOG")
    if not path or "test_architectures.py" not in report.nodeid or (report.when != "call" and report.passed):
        return
    error = str(report.longrepr).strip().splitlines()[-1] if report.failed else ""
    with open(path, "a") as f:
        f.write(json.dumps({"test": report.nodeid.rpartition("[")[2].rstrip("]"), "when": report.when,
                            "outcome": report.outcome, "error": error, "seconds": round(report.duration, 1)}) + "\n")
