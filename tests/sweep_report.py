"""The architecture sweep's outcome as a markdown table, one row per family:

    python tests/sweep_report.py out/sweep.jsonl [more.jsonl ...] > sweep.md

Each input is a log `make sweep` writes (STAGEML_SWEEP_LOG, tests/conftest.py); a later log's
outcome for a test replaces an earlier one's."""

import json
import re
import sys


def _reason(error: str) -> str:
    """The error line without pytest's prefix, paths shortened to the file."""
    error = re.sub(r"^E\s+", "", error.strip())
    return re.sub(r"/[^ :()']*/(site-packages/)?", "", error)[:240].replace("|", "\\|")


def main(paths: list) -> None:
    outcome = {}
    for path in paths:
        for line in open(path):
            record = json.loads(line)
            family, _, mode = record["test"].rpartition("-")
            outcome.setdefault(family, {})[mode] = record
    print("| family | single-tenant | multi-tenant | why not |")
    print("|---|---|---|---|")
    for family in sorted(outcome):
        modes = outcome[family]
        cells = [modes[m]["outcome"] if m in modes else "not run" for m in ("single", "multi")]
        reasons = {_reason(modes[m]["error"]) for m in ("single", "multi") if m in modes and modes[m]["error"]}
        print(f"| {family} | {cells[0]} | {cells[1]} | {'; '.join(sorted(reasons))} |")


if __name__ == "__main__":
    main(sys.argv[1:])
