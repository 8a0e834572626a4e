"""benchmarks/gpu_check.py runs every test that needs CUDA: a test that skips without a GPU runs only
there, and four such tests once stayed off its list and never ran on a GPU (all four then failed
on the H100)."""

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The tests' shared module whose NEEDS_CUDA mark skips without a GPU (tests/cuda_marks.py).
CUDA_MARKS = "cuda_marks"


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _needs_cuda(node: ast.AST) -> bool:
    """`skipif(not torch.cuda.is_available(), ...)`: skipped where there is no CUDA."""
    return (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "skipif" and node.args
            and isinstance(node.args[0], ast.UnaryOp) and isinstance(node.args[0].op, ast.Not)
            and "cuda.is_available" in ast.unparse(node.args[0]))


def cuda_tests(path: Path):
    """The node ids of `path`'s tests that skip without CUDA."""
    tree = ast.parse(path.read_text())
    markers = {target.id for stmt in tree.body if isinstance(stmt, ast.Assign) and _needs_cuda(stmt.value)
               for target in stmt.targets if isinstance(target, ast.Name)}
    markers |= {alias.asname or alias.name for stmt in tree.body
                if isinstance(stmt, ast.ImportFrom) and stmt.module == CUDA_MARKS for alias in stmt.names}
    return [f"tests/{path.name}::{stmt.name}" for stmt in tree.body
            if isinstance(stmt, ast.FunctionDef) and stmt.name.startswith("test_")
            and any(_needs_cuda(d) or (isinstance(d, ast.Name) and d.id in markers) for d in stmt.decorator_list)]


def test_every_test_that_needs_cuda_is_on_gpu_checks_list():
    listed = set(_gpu_check().GPU_TESTS)
    found = [test for path in sorted((ROOT / "tests").glob("test_*.py")) for test in cuda_tests(path)]
    assert len(found) >= 10, found  # the scan finds the markers as they are written
    missing = [test for test in found if test not in listed and test.partition("::")[0] not in listed]
    assert not missing, f"add to benchmarks/gpu_check.py's GPU_TESTS: {missing}"


def test_the_scan_sees_both_ways_of_marking_a_test(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import pytest, torch\n"
        "NEEDS = pytest.mark.skipif(not torch.cuda.is_available(), reason='r')\n"
        "OTHER = pytest.mark.skipif(torch.cuda.is_available(), reason='r')\n"
        "@NEEDS\ndef test_a(): pass\n"
        "@pytest.mark.skipif(not torch.cuda.is_available(), reason='r')\ndef test_b(): pass\n"
        "@OTHER\ndef test_c(): pass\n"
        "def test_d(): pass\n")
    assert cuda_tests(tmp_path / "test_x.py") == ["tests/test_x.py::test_a", "tests/test_x.py::test_b"]


def test_parts_are_checked_before_anything_runs(capsys):
    gpu_check = _gpu_check()
    for argv, message in ((["--parts", "tests,bogus"], "unknown part(s) bogus"),
                          (["--parts", "pageable,gpu"], "part pageable is compared with part gpu")):
        with pytest.raises(SystemExit) as exited:
            gpu_check.main(argv)
        assert exited.value.code == 2 and message in capsys.readouterr().err


def test_the_overhead_part_runs_the_backend_benchmark_at_8_workers_and_only_when_named(tmp_path, monkeypatch):
    gpu_check = _gpu_check()
    ran = []
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)

    def tee(command, transcript):
        ran.append((command, transcript.name))
        return 0, ""

    monkeypatch.setattr(gpu_check, "tee", tee)
    for stand_in in ("run_part", "record_fixtures", "pipebench"):
        monkeypatch.setattr(gpu_check, stand_in, lambda *args, name=stand_in: ran.append((name, None)))
    monkeypatch.setattr(gpu_check, "run_tests", lambda out, quick: 0)

    assert gpu_check.main(["--parts", "overhead", "--out", str(tmp_path)]) == 0
    (command, transcript), = ran
    assert Path(command[1]).name == "backend_overhead.py" and transcript == "overhead.txt"
    assert command[command.index("--workers") + 1] == "8"

    ran.clear()
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    assert ran and not any("backend_overhead.py" in " ".join(map(str, command)) for command, _ in ran)


def test_the_storage_part_checks_resnet50_with_the_toy_cnn_beside_the_sleep_only_when_named(tmp_path, monkeypatch):
    gpu_check = _gpu_check()
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    checked = []

    def pipebench(args, transcript):
        folder = tmp_path / "results" / transcript.stem
        folder.mkdir(parents=True)
        (folder / "verdict.json").write_text("{}")
        (folder / "report.md").write_text("# storage check")
        checked.append((list(args), transcript.name))
        return f"...\nresults: {folder}\n"

    monkeypatch.setattr(gpu_check, "pipebench", pipebench)
    out = tmp_path / "out"
    assert gpu_check.main(["--parts", "storage", "--out", str(out)]) == 0
    assert [(args[0], transcript) for args, transcript in checked] == [
        ("storage-check", "storage-emulated.txt"), ("storage-check", "storage-toy_cnn.txt")]
    for args, _ in checked:
        assert {"workload=resnet50", "accelerator=h100", "transform.per_sample.0.size=256"} <= set(args)
    assert [args[-2] for args, _ in checked] == ["consumer=emulated", "consumer=toy_cnn"]
    for consumer in ("emulated", "toy_cnn"):
        assert {p.name for p in (out / "storage" / consumer).iterdir()} == {"verdict.json", "report.md"}
    assert "storage" not in gpu_check.FULL_PARTS, "a full run leaves it out: it needs a device call of its own"
