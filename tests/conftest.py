import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parents[1] / "benchmarks"))  # workloads: models and inputs shared with the benchmarks


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: runs StageML's kernels on a CUDA (Hopper) GPU; skipped without one "
                                       "(`pytest -m gpu tests/test_kernels_gpu.py`)")
