"""How reliably each fault case ends well: every case of tests/fault_kit.py run N times against the
real `pipebench` command, interleaved (trial 1 of every case, then trial 2, ...), so drift on a
shared machine hits every case alike.

For each case it prints how often there was one clean line (the case's line, no other error
line, no traceback), the right exit status, the finished rows kept, and how many processes were
still alive 2 s after pipebench ended (summed over the trials). Exits 1 unless every trial of
every case was right. Run it under the benchmark lock, as everything that measures:

    flock /tmp/pipebench-measure.lock python benchmarks/fault_matrix.py             # 10 trials
    flock /tmp/pipebench-measure.lock python benchmarks/fault_matrix.py --trials 1 --case SIGKILL
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fault_kit import CASES, CaseTimeout, FaultCase, Outcome, run_case  # noqa: E402

from pipebench.base.tables import markdown_table  # noqa: E402

DEFAULT_TRIALS = 10
COLUMNS = ["case", "trials", "one clean line", "right exit status", "rows kept", "orphans left", "median s"]


def _trial(case: FaultCase) -> Optional[Outcome]:
    """One run of `case` in a fresh folder; None when the event it waited on never came."""
    with tempfile.TemporaryDirectory(prefix="fault-matrix-") as folder:
        try:
            return run_case(case, Path(folder))
        except CaseTimeout as exc:
            print(f"  {case.name}: {exc}", file=sys.stderr)
            return None


def _row(case: FaultCase, outcomes: List[Optional[Outcome]]) -> Dict[str, object]:
    done = [o for o in outcomes if o is not None]

    def rate(count: int) -> str:
        return f"{count}/{len(outcomes)}"

    return {
        "case": case.name,
        "trials": len(outcomes),
        "one clean line": rate(sum(o.clean_line for o in done)),
        "right exit status": rate(sum(o.status == case.status for o in done)),
        "rows kept": rate(sum(o.rows == case.rows for o in done)),
        "orphans left": sum(o.orphans for o in done),
        "median s": statistics.median(o.seconds for o in done) if done else None,
    }


def _perfect(case: FaultCase, outcomes: List[Optional[Outcome]]) -> bool:
    return all(o is not None and o.clean_line and o.status == case.status and o.rows == case.rows
               and o.orphans == 0 and o.inputs_intact for o in outcomes)


def _wrong(outcome: Optional[Outcome]) -> str:
    if outcome is None:
        return "WRONG: timed out"
    tail = " | ".join(outcome.stderr.strip().splitlines()[-3:])
    return (f"WRONG: status {outcome.status}, clean line {outcome.clean_line}, rows {outcome.rows}, "
            f"orphans {outcome.orphans}, input intact {outcome.inputs_intact}; stderr ends: {tail}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help="runs of each case")
    parser.add_argument("--case", action="append", default=[],
                        help="run only the cases whose name holds this text (repeatable)")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.case or any(text in c.name for text in args.case)]
    outcomes: Dict[str, List[Optional[Outcome]]] = {case.name: [] for case in cases}
    for trial in range(args.trials):
        for case in cases:
            outcome = _trial(case)
            outcomes[case.name].append(outcome)
            verdict = "ok" if _perfect(case, [outcome]) else _wrong(outcome)
            print(f"trial {trial + 1}/{args.trials} {case.name}: {verdict}", file=sys.stderr, flush=True)
    print(markdown_table([_row(case, outcomes[case.name]) for case in cases], COLUMNS,
                         right=COLUMNS[1:]))
    return 0 if all(_perfect(case, outcomes[case.name]) for case in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
