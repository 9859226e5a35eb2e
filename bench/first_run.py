"""What a newcomer waits for: the README's two commands on a fresh clone, timed.

    .venv/bin/python -m bench.first_run [--skip-test]

Clones this checkout's HEAD into a temporary folder and times, in order: `make plan` (creates .venv and installs
requirements.txt from PyPI, then plans prod-us-east-1), `make plan` again (installed), and `make test` (installs
requirements-dev.txt, then runs the suite). Prints a Markdown table for bench/RESULTS.md. Needs PyPI.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(command: list, cwd: Path) -> tuple:
    """Wall seconds and exit code of `command` as a newcomer runs it: no CI variable, no pip cache."""
    started = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                            env={**{k: v for k, v in os.environ.items() if k not in ("CI", "VIRTUAL_ENV")},
                                 "PIP_NO_CACHE_DIR": "1"})   # a new machine has no pip cache
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        print(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-1500:]}", file=sys.stderr)
    return elapsed, result.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-test", action="store_true", help="time the two plans only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        clone = Path(folder) / "gpu-cloud"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        rows = [("make plan", "first run", *timed(["make", "plan"], clone)),
                ("make plan", "again", *timed(["make", "plan"], clone))]
        if not args.skip_test:
            rows.append(("make test", "first run", *timed(["make", "test"], clone)))
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}, load average before: {os.getloadavg()[0]:.1f}\n")
    print("| command | run | wall time | exit code |\n|---|---|---|---|")
    for command, run, seconds, code in rows:
        print(f"| `{command}` | {run} | {seconds:.0f} s | {code} |")


if __name__ == "__main__":
    main()
