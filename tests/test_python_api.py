"""The Python API: `pipebench.run`, `load` and `compare` as a notebook cell or a pytest gate calls them."""

import os
import sys
from pathlib import Path

import pytest

import pipebench
from conftest import FAST_JOB, NO_CHAIN
from pipebench.base.errors import PipebenchError
from pipebench.regress.compare import FASTER, INCOMPARABLE, NO_CHANGE, NOISY, SLOWER, Comparison, JobComparison


@pytest.mark.slow
def test_a_bad_override_raises_the_clis_one_line_and_leaves_the_caller_as_it_was(tmp_path):
    cwd, argv = os.getcwd(), list(sys.argv)
    with pytest.raises(PipebenchError) as raised:
        pipebench.run(["workers=banana", f"results_dir={tmp_path}"], quiet=True)
    message = str(raised.value)
    assert "workers" in message and "\n" not in message and not message.startswith("pipebench:")
    assert (os.getcwd(), sys.argv) == (cwd, argv)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_run_returns_typed_results_that_load_and_compare_read_back(tmp_path):
    results = pipebench.run([*FAST_JOB, *NO_CHAIN, "workers=0", "rounds=2", f"results_dir={tmp_path}"], quiet=True)
    assert len(results) == 2 and results.folder.parent == tmp_path
    assert all(r.summary.samples_per_s > 0 and r.summary.workers == 0 for r in results)
    loaded = pipebench.load(results.folder)
    assert [r.job for r in loaded] == [r.job for r in results]
    # The same rounds on both sides: a ratio of exactly 1, which no threshold calls a change (two short
    # rounds may leave the interval too wide to say "no change", which is then "noisy").
    comparison = pipebench.compare(results, results.folder)
    assert comparison.verdict in (NO_CHANGE, NOISY)
    assert [j.ratio for j in comparison.jobs] == [pytest.approx(1.0)]
    with pytest.raises(PipebenchError, match="no such results folder"):
        pipebench.load(tmp_path / "absent")


def _judged(*verdicts: str) -> Comparison:
    nan = float("nan")
    jobs = tuple(JobComparison(f"job{i}", 1.0, 1.0, 1.0, nan, nan, nan, nan, nan, v, 3, 3, ())
                 for i, v in enumerate(verdicts))
    return Comparison(Path("a"), Path("b"), 0.1, jobs, (), False, False)


@pytest.mark.parametrize("verdicts, whole", [
    ((FASTER, SLOWER, NO_CHANGE), SLOWER),
    ((FASTER, NO_CHANGE), FASTER),
    ((FASTER, NOISY), NOISY),
    ((NO_CHANGE, NO_CHANGE), NO_CHANGE),
    ((), INCOMPARABLE),
])
def test_a_comparisons_verdict_is_its_worst_jobs_word(verdicts, whole):
    assert _judged(*verdicts).verdict == whole
