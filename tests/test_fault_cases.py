"""Each fault case once against the real CLI: the right exit status, one clean line, the finished
rows kept, the case's input untouched and no process left 2 s after pipebench ends
(benchmarks/fault_matrix.py repeats them)."""

import pytest
from fault_kit import CASES, run_case


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_fault_case(case, tmp_path):
    outcome = run_case(case, tmp_path)
    assert outcome.status == case.status, outcome.stderr
    assert outcome.clean_line, outcome.stderr
    assert outcome.rows == case.rows, outcome.stderr
    assert outcome.orphans == 0, "processes outlived the sweep"
    assert outcome.results_line or not case.results_line, "the results folder is named last"
    assert outcome.inputs_intact, "the case's input folder changed"
