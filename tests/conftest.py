"""Shared helpers: compose real pipebench configs, and run the real CLI in a subprocess; and the
rule that lets tests run side by side under pytest-xdist while those that measure run alone."""

import fcntl
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator, List, Sequence, Tuple

import pytest

from explore_kit import write_chain_project
from multirank_kit import write_rank_project

from pipebench.config.compose import compose_job_spec
from pipebench.config.specs import JobSpec

# A decode-free chain that runs in well under a millisecond a sample, for end-to-end runs.
TINY_DATASET = ["dataset=random_tensors", "dataset.shape=[3,32,32]", "dataset.length=512"]
QUICK_RUN = ["run=quick", "run.progress=false", "loader.batch_size=8"]
# No transform at all, per sample or per batch: a job whose cost is the loader's own.
NO_CHAIN = ["transform.per_sample=[]", "transform.per_batch=[]"]
# No torch.profiler pass (extra steps under the profiler after the measured ones, at workers=0), for
# a test that reads no trace or profile: work the test would not look at.
NO_PROFILE = ["trace=none", "run.profile_steps=0"]
# Jobs as short as a job can be, for a test about what a run writes rather than what it measures:
# its cost is then the job processes' start-up.
# No thread-scaling profile either: under a thread backend it adds about a second a step of the chain.
FAST_JOB = [*TINY_DATASET, *QUICK_RUN, "consumer=none", *NO_PROFILE, "run.warmup_steps=0", "run.min_time_s=0",
            "run.thread_profile=false"]


# The installed console script, beside this interpreter: the command exactly as a user types it.
PIPEBENCH_SCRIPT = Path(sys.executable).with_name("pipebench")
# The lock file every xdist worker of one session shares, beside the workers' own temp folders.
ALONE_LOCK = "tests-alone.lock"
# Times a test that measures (`alone`) runs again after an assertion misses: a reading on a quiet
# host still misses now and then by a wake-up or a reading a few batches late, while a meter that
# is wrong misses every time. Only an AssertionError reruns, never a crash; known-cost tests re-measure on their
# own terms (known_cost_kit) and are left to it.
MEASURED_RERUNS = 1


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """Mark each test that measures to run once more when an assertion misses (pytest-rerunfailures),
    and order the files so the tests that share the cores run before those that measure alone."""
    for item in items:
        function = getattr(item, "function", None)
        if measures_alone(item) and not getattr(function, "known_cost", False):
            item.add_marker(pytest.mark.flaky(reruns=MEASURED_RERUNS, only_rerun=[AssertionError]))
    items[:] = sorted(items, key=file_order(items))


def measures_alone(item: pytest.Item) -> bool:
    """Marked `alone` (itself or its module), and not `beside`: a behaviour test in a module of
    measuring ones, whose assertions hold with other tests beside it."""
    return item.get_closest_marker("alone") is not None and item.get_closest_marker("beside") is None


def file_order(items: Sequence[pytest.Item]) -> Callable[[pytest.Item], Tuple[float, int]]:
    """A sort key that keeps each file's tests together and in order, and puts first the files with
    the fewest tests that measure alone, the slowest of them first.

    xdist hands out whole files in this order (`--dist loadfile --no-loadscope-reorder`). While a
    test runs alone every other xdist process waits idle, so files of behaviour tests mixed among
    them left a core idle at each switch (920 s for the suite on 2 cores, against 743 s of test time
    alone plus half of the rest): run first, they pair up on the cores, and the tests that measure
    follow one after another. Within a group, the files with the most slow tests go first, so no
    long file starts last while the other process idles.
    """
    alone, slow, total = Counter(), Counter(), Counter()
    for item in items:
        path = item.path
        total[path] += 1
        alone[path] += measures_alone(item)
        slow[path] += item.get_closest_marker("slow") is not None
    return lambda item: (alone[item.path] / total[item.path], -slow[item.path])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem) -> Iterator[None]:
    """Under xdist, hold a shared lock for a test's setup, call and teardown, or an exclusive one for
    a test marked `alone`: a test that asserts on measured rates, CPU time or the host's load then
    has the cores to itself, while tests of behaviour share them. Its module fixtures are set up
    inside the first test's protocol, so they are held too."""
    if not hasattr(item.config, "workerinput"):  # not an xdist worker: tests run one at a time anyway
        yield
        return
    lock_path = item.config._tmp_path_factory.getbasetemp().parent / ALONE_LOCK
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if measures_alone(item) else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def compose_spec(overrides: Sequence[str]) -> JobSpec:
    return compose_job_spec(overrides)


def run_cli(args: List[str], cwd: Path, timeout: float = 240, prefix: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """`pipebench ...` exactly as a user types it, from the installed console script (after `prefix`,
    e.g. taskset)."""
    return subprocess.run([*prefix, str(PIPEBENCH_SCRIPT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def results_folder(stdout: str) -> Path:
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("results: "), f"last line was {last!r}"
    return Path(last[len("results: "):])


@pytest.fixture
def user_project(tmp_path: Path) -> Path:
    """A user's own project: a transform module and a config dir with a chain that uses it."""
    (tmp_path / "my_transforms.py").write_text(
        "import torch\n\n"
        "class AddOne:\n"
        "    def __call__(self, x):\n"
        "        return x.to(torch.int16) + 1\n"
    )
    chain = tmp_path / "my_conf" / "transform"
    chain.mkdir(parents=True)
    (chain / "tiny.yaml").write_text(
        "per_sample:\n"
        "  - _target_: my_transforms.AddOne\n"
        "  - _target_: pipebench.transforms.synthetic.BusyWait\n"
        "    ms: 0.2\n"
        "per_batch:\n"
        "  - _target_: pipebench.transforms.color.BatchScale\n"
    )
    return tmp_path


@pytest.fixture
def chain_project(tmp_path: Path) -> Path:
    """explore_kit's project: the explore tests' three chains (test_explore.py, test_explore_cli.py)."""
    return write_chain_project(tmp_path)


@pytest.fixture
def rank_project(tmp_path: Path) -> Path:
    """multirank_kit's project: chains of known cost and faulty ones for two ranks (test_distributed*.py)."""
    return write_rank_project(tmp_path)


@pytest.fixture
def torchrun_project(tmp_path: Path) -> Path:
    """attach_ranks_kit's two-rank training script (test_attach_ranks*.py). Imported here, not at the top:
    the kit imports this module."""
    from attach_ranks_kit import write_rank_script

    return write_rank_script(tmp_path)


def main_in(cwd: Path, args: Sequence[str], capfd, monkeypatch) -> Tuple[int, str, str]:
    """`pipebench ARGS` through main() in this process, from `cwd`: its exit status, stdout and stderr, its
    job processes' lines too (capfd reads the descriptors they inherit). For a test that reads what a run
    writes: the xdist process has torch imported already, where a console script pays it again."""
    from pipebench.cli.main import main

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command puts its working directory on it
    status = main(list(args))
    return (status, *capfd.readouterr())


def assert_config_error_is_one_line(args: Sequence[str], named: str, capsys, results_dir: Path) -> None:
    """`pipebench run ARGS` exits 2 with one `pipebench: error:` line naming `named`, and writes nothing."""
    from pipebench.cli.main import main

    status = main(["run", *args, f"results_dir={results_dir}"])
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert err.startswith("pipebench: error: ") and "\n" not in err, err
    assert named in err
    assert not any(results_dir.iterdir()), "nothing may be measured or written for a bad config"
