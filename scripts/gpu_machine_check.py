#!/usr/bin/env python3
"""Run the node verifier on a machine with a real NVIDIA GPU, at boot (--mode boot) and as the run-time checker
(--mode runtime), and report what every check did. Standard library plus pynvml, like the verifier itself.

    python3 scripts/gpu_machine_check.py [--out DIR] [--bundle DIR]

The expectation is built from what the hardware reports (model, count, memory, the NVLink links that exist), so
the question is whether the real binding drives every check to a reasoned verdict within the budget, with no
unexpected error. `--bundle DIR` (required) holds gpu_verify.py, pynvml.py and faults.json as the node's bundle
does. Prints one JSON summary; the reports are
written to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict

BUDGET_S = 60


def hardware_expectation(pynvml: Any, classify_gpu_name, instance_type: str = "unknown") -> Dict[str, Any]:
    """EXPECT.json for this machine, from what NVML reports of GPU 0 (None when the GPU is not a catalog model)."""
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        text = lambda v: v.decode() if isinstance(v, bytes) else v       # noqa: E731
        name = text(pynvml.nvmlDeviceGetName(handle))
        memory_mib = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
        driver = text(pynvml.nvmlSystemGetDriverVersion())
        links = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                    links += 1
            except pynvml.NVMLError:
                break
        mig = "disabled"
        try:
            mig = "enabled" if pynvml.nvmlDeviceGetMigMode(handle)[0] else "disabled"
        except pynvml.NVMLError:
            pass
    finally:
        pynvml.nvmlShutdown()
    model = classify_gpu_name(name)
    if model is None:
        return None
    return {"instanceType": instance_type, "gpuModel": model, "gpuCount": count, "gpuMemoryMiB": memory_mib,
            "nvlinkLinksPerGpu": links, "nvswitch": links > 0, "driverBranch": driver.split(".")[0],
            "driverVersion": None, "maxTempC": 85, "migMode": mig, "eccExpected": False,
            "eccReservesMemory": False, "_nvmlName": name, "_driver": driver}


def run(bundle: Path, out: Path, mode: str, expect: Path) -> Dict[str, Any]:
    report = out / f"{mode}.json"
    argv = [sys.executable, str(bundle / "gpu_verify.py"), "--expect", str(expect), "--report", str(report),
            "--textfile", str(out / f"{mode}.prom"), "--budget-s", str(BUDGET_S), "--faults",
            str(bundle / "faults.json"), "--mode", mode]
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=BUDGET_S + 30,
                            env=dict(os.environ, PYTHONPATH=str(bundle)))
    wall = time.monotonic() - started
    data = json.loads(report.read_text())
    statuses: Dict[str, int] = {}
    for check in data["checks"]:
        statuses[check["status"]] = statuses.get(check["status"], 0) + 1
    return {"mode": mode, "exit": result.returncode, "wallS": round(wall, 2), "verdict": data["verdict"],
            "faults": data["faults"], "remediation": data["remediation"], "statuses": statuses,
            "unexpectedErrors": [c for c in data["checks"] if "unexpected error" in str(c.get("detail"))],
            "checks": {f"{c['name']}{'' if c['gpu'] is None else ':' + str(c['gpu'])}":
                       [c["status"], c["detail"][:160]] for c in data["checks"]}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check")))
    parser.add_argument("--bundle", type=Path, required=True,
                        help="folder with gpu_verify.py, pynvml.py and faults.json, as the node's bundle")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(args.bundle))
    import gpu_verify  # noqa: E402  (the bundle's)
    import pynvml  # noqa: E402  (the bundle's pinned binding)

    expect = hardware_expectation(pynvml, gpu_verify.classify_gpu_name)
    if expect is None:
        print(json.dumps({"error": "the GPU is not a catalog model"}))
        return 1
    facts = {k: expect.pop(k) for k in ("_nvmlName", "_driver")}
    (args.out / "expect.json").write_text(json.dumps(expect))
    summary = {"machine": facts, "expect": expect,
               "runs": [run(args.bundle, args.out, mode, args.out / "expect.json") for mode in ("boot", "runtime")]}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
