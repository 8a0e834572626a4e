"""The known-cost retry: a failure on a quiet host is measured once more and a second one fails; one beside
load is measured again or skips."""

import inspect

import known_cost_kit
import pytest
from known_cost_kit import ATTEMPTS, QUIET_ATTEMPTS, known_cost

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

QUIET = {"host_other_cpu_cores": 0.0, "host_steal_pct": 0.0}
BUSY = {"host_other_cpu_cores": 1.5, "host_steal_pct": 0.0}
STOLEN = {"host_other_cpu_cores": 0.0, "host_steal_pct": 30.0}


@pytest.fixture
def loads(monkeypatch):
    """The host's load over each attempt, in order, instead of /proc/stat's."""
    queue = []
    monkeypatch.setattr(known_cost_kit, "read_host", lambda: None)
    monkeypatch.setattr(known_cost_kit, "other_load", lambda first, last: queue.pop(0))
    return queue


def _failing_until(passes_at, calls):
    def test(tmp_path):
        calls.append(tmp_path)
        assert len(calls) >= passes_at, "read 119 samples/s for 154"
    return test


def test_a_second_failure_on_a_quiet_host_fails_and_names_the_load(loads, tmp_path):
    calls = []
    loads.extend([QUIET] * QUIET_ATTEMPTS)
    with pytest.raises(AssertionError, match="119 samples/s") as failure:
        known_cost(_failing_until(ATTEMPTS + 1, calls))(tmp_path=tmp_path)
    assert len(calls) == QUIET_ATTEMPTS
    assert "host during this attempt: other processes 0.00" in "".join(failure.value.__notes__)


def test_one_miss_on_a_quiet_host_is_measured_once_more(loads, tmp_path):
    calls = []
    loads.extend([QUIET])
    known_cost(_failing_until(2, calls))(tmp_path=tmp_path)
    assert calls == [tmp_path, tmp_path / "attempt2"]


@pytest.mark.parametrize("load", [BUSY, STOLEN], ids=["other processes", "steal"])
def test_a_failure_beside_load_is_measured_again_in_a_fresh_folder(loads, tmp_path, load):
    calls = []
    loads.extend([load])
    known_cost(_failing_until(2, calls))(tmp_path=tmp_path)
    assert calls == [tmp_path, tmp_path / "attempt2"] and calls[1].is_dir()


def test_a_quiet_failure_among_loaded_ones_fails_and_never_skips(loads, tmp_path):
    calls = []
    loads.extend([BUSY, QUIET, BUSY][:ATTEMPTS])
    with pytest.raises(AssertionError):
        known_cost(_failing_until(ATTEMPTS + 1, calls))(tmp_path=tmp_path)
    assert len(calls) == ATTEMPTS


def test_every_attempt_beside_load_skips_naming_the_load_and_the_failure(loads, tmp_path):
    calls = []
    loads.extend([BUSY] * ATTEMPTS)
    skipped = rf"unmeasurable, every one of {ATTEMPTS} attempts failed beside load .*1\.50 of .*119 samples/s"
    with pytest.raises(pytest.skip.Exception, match=skipped):
        known_cost(_failing_until(ATTEMPTS + 1, calls))(tmp_path=tmp_path)
    assert len(calls) == ATTEMPTS


def test_a_passing_test_runs_once_and_pytest_still_sees_its_fixtures(loads):
    calls = []
    wrapped = known_cost(_failing_until(1, calls))
    assert list(inspect.signature(wrapped).parameters) == ["tmp_path"]
    wrapped(tmp_path="here")
    assert calls == ["here"] and loads == []


def test_a_test_that_measures_reruns_once_on_an_assertion_alone(request):
    """This module measures (`alone`): conftest.py marks each of its tests to run once more after an
    AssertionError, and only then."""
    flaky = request.node.get_closest_marker("flaky")
    assert flaky is not None and flaky.kwargs == {"reruns": 1, "only_rerun": [AssertionError]}


@known_cost
def test_a_known_cost_test_gets_no_rerun_beside_its_own_attempts(request):
    assert request.node.get_closest_marker("flaky") is None
