"""Re-record the evidence files beside this script from real trials on the installed wheel.

    .venv/bin/python tests/recorded/record.py LEGACY_PLUGIN

Each file is the harness's report of one trial (`Evidence.to_json()`), with the
site-packages prefix replaced by `<site>` so the files read the same anywhere.
The classifier tests replay them; nothing is re-run there.
"""

import json
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from loadfuzz.hostenv import libpython_path
from loadfuzz.run.harness import HarnessStep, Limits, run_cold

SITE = Path(sysconfig.get_paths()["purelib"])
ET = SITE / "executorch"
HERE = Path(__file__).parent


def record(name: str, steps: list[HarnessStep], python: bool = False) -> None:
    prelude = [HarnessStep("g", libpython_path())] if python else []
    evidence = run_cold([*prelude, *steps], Limits(timeout_s=20), prelude=len(prelude))
    text = json.dumps(evidence.to_json(), indent=1).replace(str(SITE), "<site>")
    (HERE / f"{name}.json").write_text(text + "\n")
    print(name, evidence.exit_code, evidence.signal, evidence.started, evidence.done)


def main() -> None:
    legacy = Path(sys.argv[1]).resolve()
    quantized = ET / "lib/libexecutorch_kernels_quantized.so"
    aot = ET / "kernels/quantized/libquantized_ops_aot_lib.so"
    extension = ET / "extension/pybindings/_C.cpython-311-x86_64-linux-gnu.so"
    record("executorch_reregister", [HarnessStep("g", quantized), HarnessStep("g", legacy)])
    record("executorch_reregister_reversed", [HarnessStep("l", legacy), HarnessStep("l", quantized)])
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "libquantized_ops_aot_lib_copy.so"
        shutil.copy(aot, copy)
        record("torch_duplicate_op", [HarnessStep("g", aot), HarnessStep("g", copy)], python=True)
    record("clean_etdump_then_extension",
           [HarnessStep("g", ET / "lib/libexecutorch_etdump.so"), HarnessStep("g", extension)],
           python=True)
    record("extension_without_libpython", [HarnessStep("g", extension)])
    record("missing_library", [HarnessStep("g", Path("/nonexistent/libmissing.so"))])


if __name__ == "__main__":
    main()
