"""The verifier against a real NVIDIA GPU, when this machine has one (skipped otherwise, even in CI: CI machines have
no GPU). On a GPU machine, `scripts/gpu_machine_check.py` runs the same two runs and prints the evidence.

The expectation is built from what the hardware itself reports (model, count, memory, NVLink links that exist), so
the test asks: does the real binding drive every check to a reasoned verdict within the budget, with no unexpected
error, at boot and as the run-time checker?
"""
import json
import shutil
import sys

import pytest

import pynvml  # noqa: E402  (a requirement: its absence is an error, not a skip)
from decisions.nodes.faults import bundle_document
from scripts.gpu_machine_check import BUDGET_S, hardware_expectation, run
from tests.conftest import ROOT


@pytest.mark.parametrize("mode", ["boot", "runtime"])
def test_verifier_on_real_gpu(tmp_path, mode):
    sys.path.insert(0, str(ROOT / "userdata"))
    import gpu_verify  # noqa: E402  (the single-file verifier, as shipped)

    try:
        expect = hardware_expectation(pynvml, gpu_verify.classify_gpu_name)
    except pynvml.NVMLError as err:     # no driver or no GPU on this machine
        pytest.skip(f"no NVIDIA GPU here ({type(err).__name__}); run on a GPU machine")
    if expect is None:
        pytest.skip("the GPU is not a model gpu-cloud's catalog knows")
    for key in ("_nvmlName", "_driver"):
        expect.pop(key)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.copy(ROOT / "userdata" / "gpu_verify.py", bundle)
    shutil.copy(pynvml.__file__, bundle)
    (bundle / "faults.json").write_text(json.dumps(bundle_document()))
    (tmp_path / "expect.json").write_text(json.dumps(expect))
    result = run(bundle, tmp_path, mode, tmp_path / "expect.json")
    print(json.dumps(result, indent=2))          # the evidence for the closing note (pytest -s)
    assert result["exit"] in (0, 1) and result["verdict"] in ("pass", "fail") and result["wallS"] < BUDGET_S + 10
    assert set(result["statuses"]) <= {"pass", "fail", "warn", "skip"}
    assert not result["unexpectedErrors"]
