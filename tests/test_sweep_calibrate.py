"""The calibration before a sweep's jobs (pipebench.sweep.calibrate): a results folder it cannot
write is one line, in a job process's child as in the command."""

from dataclasses import dataclass
from typing import Tuple

import pytest

from pipebench.base.errors import USAGE_EXIT_STATUS
from pipebench.measure import calibration
from pipebench.sweep.calibrate import TimedCalibration, calibrate


@dataclass(frozen=True)
class Timed:
    """What run_calibration returns, without the seconds of timing it."""

    score_s: float = 0.004
    samples_s: Tuple[float, ...] = (0.004,)


def test_a_folder_the_calibration_cannot_be_written_to_is_one_line_where_it_was_timed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(calibration, "run_calibration", Timed)
    missing = tmp_path / "gone"
    error_file = tmp_path / "error.txt"
    assert TimedCalibration(str(missing), str(error_file))() == USAGE_EXIT_STATUS  # a job process's child
    assert str(missing) in error_file.read_text() and len(error_file.read_text().splitlines()) == 1
    with pytest.raises(OSError):  # the command's own: its handler makes the line
        calibrate(missing, None)
    assert calibrate(tmp_path, None) is None and (tmp_path / "calibration.json").is_file()
    assert "4.0 ms a repetition" in capsys.readouterr().out
