"""How the test run splits and records its GPU steps (bench/device_check.sh): the step names,
which tests name the Hopper attention family, and the record of a test whose worker crashed. A
module of its own so that tests import it by a name no other file has (two conftest.py files
exist under tests/, and under xdist ``from conftest import`` may find the other one)."""
from pathlib import Path
import re

# The GPU steps of bench/device_check.sh, in the order it runs them.
GPU_STEPS = ("triton", "cuda", "hopper")


def names_hopper_kernel(name: str) -> bool:
    """Whether a test name (parameter ids included) names the Hopper attention family (its TMA
    copies can fault the CUDA context): the word "hopper" between non-alphanumerics
    ("test_opcheck_hopper[16]", "test_x[hopper-128]"), not inside another word ("grasshopper")."""
    return "hopper" in re.split(r"[^0-9a-z]+", name.lower())


# Parameter ids that name a backend or a cuda attention kernel, for a test known by its id alone.
BACKEND_IDS = ("reference", "triton", "sim", "cuda")
KERNEL_IDS = ("mma", "wgmma", "hopper")


def crash_entry(nodeid: str, rootdir) -> dict:
    """The hardware-record entry of a test whose xdist worker died under it (a crash, or
    pytest-timeout's thread method ending it): failed, with the backend and kernel its parameter
    ids name (its dtype is unknown there)."""
    path, _, name = nodeid.partition("::")
    words = set(name.partition("[")[2].rstrip("]").split("-"))
    params = {}
    for key, known in (("backend", BACKEND_IDS), ("kernel", KERNEL_IDS)):
        hits = [w for w in known if w in words]
        if len(hits) == 1:
            params[key] = hits[0]
    return {"nodeid": nodeid, "file": str(Path(rootdir) / path),
            "test": name.split("::")[-1].partition("[")[0], "params": params,
            "outcome": "failed", "crashed": True}
