"""The package's stages import one way: a module imports its own stage or a lower one, never a higher one.

Stages rank config → pipeline → record → measure → report → regress → explore (record, the result type,
sits under measure, which returns it), with `base` under all
and `cli` on top; `attach` (a user's own loop, watched) measures and writes its results, so it sits
above record and below report. Every import counts, function-level ones included, and no two modules may import
each other through any chain (a cycle), and no two folders import each other, the symlinked catalogues
read as the folders they name.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pipebench"
# Lowest first, one tier a rank: a module imports its own tier or a lower one. The catalogues sit at the
# repo top but install as pipebench.datasets / .transforms; they are built by the pipeline stage, so they
# rank with it. storage (file reads, object stores, the page cache, the rank) sits under the pipeline.
# record (result.json as one typed JobResult, and the results folder's files) sits under measure, which
# returns that type, and over the pipeline.
# model (the cost model, the one spread-and-verdict rule, the shard lines) imports base only, so the
# plan-time checks read it as well as report, regress, explore and tune.
# sweep (a command's jobs expanded, checked and launched) sits under tune and storage_track, which run
# their parts as sweeps, and over report, whose tables a finished sweep writes.
TIERS = (("base",), ("model",), ("config",), ("storage",), ("pipeline", "datasets", "transforms"), ("record",), ("measure",),
         ("attach",), ("report",), ("regress",), ("explore",), ("sweep",), ("tune",), ("storage_track",),
         ("cli", "api"))
STAGES = tuple(stage for tier in TIERS for stage in tier)
STAGE_RANK = {stage: rank for rank, tier in enumerate(TIERS) for stage in tier}


def _catalogues(package: Path) -> Dict[str, Path]:
    """The stage folders that are symlinks (pipebench/datasets -> ../datasets), resolved to the folders
    they name, so the checks read the files the package imports."""
    return {path.name: path.resolve() for path in package.iterdir() if path.is_symlink() and path.name in STAGES}


CATALOGUES = _catalogues(PACKAGE)


def _modules(package: Path = PACKAGE, catalogues: Dict[str, Path] = CATALOGUES) -> Iterator[Tuple[str, Path]]:
    for stage in STAGES:
        folder = catalogues.get(stage, package / stage)
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(("pipebench", stage) + parts), path


def _imports(path: Path) -> Set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("pipebench.")}


def _graph(package: Path = PACKAGE, catalogues: Dict[str, Path] = CATALOGUES) -> Dict[str, Set[str]]:
    modules = dict(_modules(package, catalogues))
    return {name: {target for target in _imports(path) if target in modules} for name, path in modules.items()}


def _stage(module: str) -> str:
    return module.split(".")[1]


def test_every_stage_folder_exists_and_holds_modules():
    names = [name for name, _ in _modules()]
    assert {_stage(name) for name in names} == set(STAGES)
    assert len(names) > 40
    strays = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert strays == [], "every module belongs to a stage's folder"


def _upward(graph: Dict[str, Set[str]]) -> List[str]:
    return sorted(f"{source} -> {target}" for source, targets in graph.items() for target in targets
                  if STAGE_RANK[_stage(target)] > STAGE_RANK[_stage(source)])


def _cycles(graph: Dict[str, Set[str]]) -> List[str]:
    cycles: List[str] = []

    def visit(node: str, path: Tuple[str, ...]) -> None:
        for target in graph[node]:
            if target in path:
                cycles.append(" -> ".join(path[path.index(target):] + (target,)))
            elif target not in done:
                visit(target, path + (target,))
        done.add(node)

    done: Set[str] = set()
    for start in sorted(graph):
        if start not in done:
            visit(start, (start,))
    return cycles


def test_no_module_imports_a_higher_stage():
    assert _upward(_graph()) == []


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def _two_way(graph: Dict[str, Set[str]]) -> List[str]:
    """Each pair of stage folders that import each other, whatever their ranks: a tier of equals (the
    catalogues beside pipeline) passes the rank check both ways, so only this finds such a pair."""
    pairs = {(_stage(source), _stage(target)) for source, targets in graph.items() for target in targets}
    return sorted(f"{a} <-> {b}" for a, b in pairs if a < b and (b, a) in pairs)


def test_the_catalogues_are_read_through_their_symlinks_and_no_two_folders_import_each_other():
    assert CATALOGUES == {"datasets": REPO / "datasets", "transforms": REPO / "transforms"}
    assert _two_way(_graph()) == []


def test_record_imports_nothing_from_measure():
    """record/ holds result files: it writes and reads them without the measuring side."""
    offenders = sorted(f"{source} -> {target}" for source, targets in _graph().items() if _stage(source) == "record"
                       for target in targets if _stage(target) == "measure")
    assert offenders == []


def test_no_stage_imports_the_cli_and_cli_init_is_empty():
    """A job process that loads cli/run.py must not import every verb."""
    assert (PACKAGE / "cli" / "__init__.py").read_text().strip() == ""
    offenders = [source for source, targets in _graph().items() if _stage(source) != "cli"
                 for target in targets if _stage(target) == "cli"]
    assert offenders == []


def test_the_checker_finds_a_planted_upward_import_and_cycle(tmp_path):
    """The checks can fail: a measure module importing report, and a cycle inside record, are caught."""
    package = tmp_path / "pipebench"
    for stage in STAGES:
        (package / stage).mkdir(parents=True)
        (package / stage / "__init__.py").write_text("")
    (package / "measure" / "job.py").write_text("def f():\n    from pipebench.report.tables import x\n")
    (package / "report" / "tables.py").write_text("x = 1\n")
    (package / "record" / "a.py").write_text("from pipebench.record import b\n")
    (package / "record" / "b.py").write_text("import pipebench.record.a\n")
    graph = _graph(package, {"datasets": package / "datasets", "transforms": package / "transforms"})
    assert _upward(graph) == ["pipebench.measure.job -> pipebench.report.tables"]
    assert len(_cycles(graph)) == 1 and "pipebench.record.a" in _cycles(graph)[0]


def test_the_checker_finds_a_planted_two_way_pair_through_a_symlinked_catalogue(tmp_path):
    """pipeline and a symlinked catalogue rank alike, so only the two-way check sees them import each other."""
    package, catalogue = tmp_path / "pipebench", tmp_path / "datasets"
    for folder in [package / stage for stage in STAGES if stage != "datasets"] + [catalogue]:
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
    (package / "datasets").symlink_to(catalogue, target_is_directory=True)
    (package / "pipeline" / "check.py").write_text("from pipebench.datasets.rows import Rows\n")
    (package / "pipeline" / "build.py").write_text("x = 1\n")
    (catalogue / "rows.py").write_text("Rows = 1\n")
    (catalogue / "reads.py").write_text("def f():\n    from pipebench.pipeline.build import x\n")
    graph = _graph(package, _catalogues(package))
    assert _upward(graph) == [] and _cycles(graph) == [], "one rank, no cycle: the older checks pass it"
    assert _two_way(graph) == ["datasets <-> pipeline"]


# Modules that cost a job process or a CLI start a second or more to import, and that a job whose
# chain does not use them never needs: torchvision (torch._dynamo with it) and scipy.stats.
HEAVY_OPTIONAL_MODULES = ("torchvision", "scipy.stats")


# One interpreter for both probes below (torch's import, seconds, paid once): the job process's
# modules are imported, the heavy optional ones then imported are noted, the fingerprint's
# torchvision version is read and whether that imported torchvision noted, and last torchvision is
# imported for the version it says.
JOB_PROCESS_PROBE = (
    "import json, sys, pipebench.sweep.one_job, pipebench.measure.job_process, pipebench.cli.run\n"
    f"heavy = [m for m in {HEAVY_OPTIONAL_MODULES!r} if m in sys.modules]\n"
    "from pipebench.measure.fingerprint import torchvision_version\n"
    "unimported = torchvision_version()\n"
    "imported = 'torchvision' in sys.modules\n"
    "import torchvision\n"
    "print(json.dumps({'heavy': heavy, 'unimported': unimported, 'imported': imported,\n"
    "                  'version': torchvision.__version__}))\n"
)


@pytest.fixture(scope="module")
def job_process_probe() -> Dict[str, object]:
    out = subprocess.run([sys.executable, "-c", JOB_PROCESS_PROBE], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.slow
def test_a_job_process_imports_neither_torchvision_nor_scipy_stats_until_a_chain_asks(job_process_probe):
    """A tiny job's cost is mostly its process start; this keeps it from paying for what it never uses."""
    assert job_process_probe["heavy"] == []


@pytest.mark.slow
def test_the_fingerprint_reads_torchvisions_version_without_importing_it(job_process_probe):
    assert not job_process_probe["imported"]
    assert job_process_probe["unimported"] == job_process_probe["version"], job_process_probe


def test_a_verb_that_reads_results_starts_without_torch_or_hydra():
    """`pipebench compare`, `history` and `report` read result files: only the verb asked for is imported."""
    probe = (
        "import sys\n"
        "from pipebench.cli.main import asked_verbs, verbs\n"
        "assert asked_verbs(['compare', 'a', 'b']) == ('compare',)\n"
        "verbs(asked_verbs(['compare', 'a', 'b']) + asked_verbs(['history', 'h.csv']) + asked_verbs(['report', 'r']))\n"
        "print(','.join(m for m in ('torch', 'hydra') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_an_unknown_or_missing_verb_gets_every_verb_for_argparse_to_list():
    from pipebench.cli.main import VERB_NAMES, asked_verbs

    assert asked_verbs(["--help"]) == VERB_NAMES
    assert asked_verbs(["nope"]) == VERB_NAMES
    assert asked_verbs(["-h", "run"]) == ("run",)
