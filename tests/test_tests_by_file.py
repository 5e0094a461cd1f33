"""CONTRIBUTING's generated "Tests by file" table is exactly what tests/tests_by_file.json (the
coverage-derived map) renders, and the map's recorder counts what it should."""
import json
import sys

import tests_by_file as tbf


def test_contributing_table_is_the_committed_map():
    data = json.loads(tbf.DATA.read_text())
    got = tbf.contributing_section(tbf.CONTRIBUTING.read_text())
    assert got is not None, "CONTRIBUTING.md lost its generated tests-by-file section"
    assert got == tbf.section(data), ("CONTRIBUTING.md's tests-by-file table differs from "
                                      "tests/tests_by_file.json: python tests/tests_by_file.py "
                                      "contributing")


def test_the_map_names_files_that_exist():
    data = json.loads(tbf.DATA.read_text())
    assert data
    for src, tests in data.items():
        assert (tbf.ROOT / src).is_file(), src
        for t in tests:
            assert (tbf.ROOT / "tests" / t).is_file(), t


def test_a_launcher_maps_to_its_cu_file_and_headers():
    table = tbf.launcher_sources()
    files = tbf.sim_sources("verify_sample_filter", table)
    assert {"csrc/verify_tree.cu", "csrc/include/jetspec/verify_tree.cuh", "csrc/bindings.cpp"} <= set(files)
    assert "csrc/silu_mul.cu" not in files
    assert "csrc/include/jetspec/silu_mul.cuh" in tbf.sim_sources("silu_mul", table)
    assert tbf.sim_sources("device_count", table) == ["csrc/bindings.cpp"]


def test_the_recorder_counts_calls_not_imports():
    """A function of the package called under the hook is recorded; a module whose body runs
    (an import) under it is not, nor what that body calls."""
    from jetspec_kernels import checks
    rec = tbf.Recorder()
    sys.modules.pop("jetspec_kernels.demo_random", None)
    previous = sys.getprofile()
    sys.setprofile(rec)
    try:
        checks.integer("x", 3, lo=0)
        import jetspec_kernels.demo_random  # noqa: F401  (a module no test here imports)
    finally:
        sys.setprofile(previous)
    assert "jetspec_kernels/checks.py" in rec.files
    assert "jetspec_kernels/demo_random.py" not in rec.files
