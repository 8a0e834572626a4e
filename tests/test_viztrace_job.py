"""trace=viztracer end to end: measure_job writes one timeline of the main process and every worker.

The traced pass runs after the measured repeats on a fresh loader; trace=none writes no trace and
the default trace=torch keeps its workers=0 torch.profiler trace.
"""

import dataclasses
import json
from collections import defaultdict

import pytest
from conftest import QUICK_RUN, TINY_DATASET, compose_spec

from pipebench.measure.job import measure_job
from pipebench.measure.viztrace import CATEGORY, TRACE_FILE

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

BUSY = {"_target_": "pipebench.transforms.synthetic.BusyWait", "ms": 0.2}
TORCH_TRACE_FILE = "trace.json"


def _spec(*extra):
    # min_time_s=0: the measured part is only a few steps; the traced pass is run.profile_steps=2.
    spec = compose_spec([*TINY_DATASET, *QUICK_RUN, "run.min_time_s=0", "run.repeats=1",
                         "run.profile_steps=2", *extra])
    return dataclasses.replace(spec, per_sample=(BUSY,))


def test_viztracer_job_traces_main_and_every_worker(tmp_path):
    record = measure_job(_spec("trace=viztracer", "workers=2"), tmp_path)
    path = tmp_path / TRACE_FILE
    assert path.is_file() and record.sections["artifacts"] == {"viztrace": TRACE_FILE}
    assert not (tmp_path / TORCH_TRACE_FILE).exists()
    names = defaultdict(set)
    for e in json.loads(path.read_text())["traceEvents"]:
        if e["ph"] == "X" and e.get("cat") == CATEGORY:
            assert e["dur"] >= 0
            names[e["pid"]].add(e["name"])
    summary = record.sections["viztrace"]
    main_pid = summary["main_pid"]
    workers = set(names) - {main_pid}
    assert len(workers) == 2, f"slices from the main process and 2 workers, got {sorted(names)}"
    assert {"main/wait", "main/h2d", "main/step"} <= names[main_pid]
    for pid in workers:
        assert {"load/RandomTensorDataset", "per_sample/BusyWait", "collate/default_collate"} <= names[pid], pid
    assert summary["workers_not_closed"] == {}, "the traced pass's workers exit cleanly"
    assert {int(pid) for pid in summary["processes"]} == {main_pid, *workers}
    # The measured numbers are untouched by tracing: the table still comes from the repeats.
    assert record.summary.steps == len(record.pass_records[0].step_ms)


def test_no_trace_file_with_trace_none(tmp_path):
    record = measure_job(_spec("trace=none", "workers=0"), tmp_path)
    assert record.sections["artifacts"] == {} and record.sections["viztrace"] is None
    assert not (tmp_path / TRACE_FILE).exists() and not (tmp_path / TORCH_TRACE_FILE).exists()


def test_default_trace_is_torch_profiler_at_workers_0(tmp_path):
    record = measure_job(_spec("workers=0"), tmp_path)
    assert (tmp_path / TORCH_TRACE_FILE).is_file() and record.sections["artifacts"]["trace"] == TORCH_TRACE_FILE
    assert not (tmp_path / TRACE_FILE).exists() and record.sections["viztrace"] is None
