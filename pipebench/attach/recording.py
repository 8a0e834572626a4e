"""A run recorded: the settings and sinks of `attach --record`, started before the script and
closed after it, in attach's process or in each rank of a torchrun job (passed through RECORD_ENV)."""

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional

from pipebench.base.typed_json import parse
from pipebench.attach.recorder import EVENTS_CSV, EVENT_COLUMNS, SERIES_COLUMNS, SERIES_CSV, RecordSettings, Recorder, recording_loaders
from pipebench.attach.recorder_files import AppendedCsv
from pipebench.attach.sinks.sink_set import SinkSpec, open_sinks
from pipebench.attach.watch import LoaderWatch

__all__ = ["RECORD_ENV", "Recording", "recorded", "recording_environment", "recording_from_environment",
           "start_files"]

# Tells each rank of `attach --record -- torchrun ...` how to record, and where.
RECORD_ENV = "PIPEBENCH_ATTACH_RECORD"


@dataclass(frozen=True)
class Recording:
    """`attach --record`: how windows are cut and stalls judged, and which sinks to push to."""

    settings: RecordSettings = field(default_factory=RecordSettings)
    sinks: SinkSpec = field(default_factory=SinkSpec)


@dataclass(frozen=True)
class _Handed:
    """RECORD_ENV's content: the results folder, and the recording's settings and sinks as dicts."""

    folder: str
    settings: Mapping[str, Any]
    sinks: Mapping[str, Any]


def start_files(folder: Path) -> None:
    """series.csv and events.csv with their headers, before ranks append to them."""
    for name, columns in ((SERIES_CSV, SERIES_COLUMNS), (EVENTS_CSV, EVENT_COLUMNS)):
        AppendedCsv(folder / name, columns).close()


@contextlib.contextmanager
def recorded(watches: List[LoaderWatch], folder: Path, recording: Optional[Recording], rank: int = 0,
             captures_folder: Optional[Path] = None) -> Iterator[Optional[Recorder]]:
    """Within the block the watched loaders are recorded into `folder` (nothing when `recording` is
    None). The sinks start first: one that cannot is a ConfigError before anything is written."""
    if recording is None:
        yield None
        return
    sinks = open_sinks(recording.sinks, rank)
    try:
        recorder = Recorder(folder, recording.settings, rank, sinks, captures_folder)
    except BaseException:
        sinks.close()
        raise
    with recording_loaders(watches, recorder):  # closing the recorder closes its sinks
        yield recorder


def recording_environment(recording: Optional[Recording], folder: Path) -> Dict[str, str]:
    """The variable a rank reads (none when the run is not recorded)."""
    if recording is None:
        return {}
    return {RECORD_ENV: json.dumps({"folder": str(folder.resolve()), **asdict(recording)})}


def recording_from_environment() -> Optional[tuple]:
    """(the results folder, the Recording) a rank was given, or None."""
    text = os.environ.get(RECORD_ENV)
    if not text:
        return None
    handed = parse(_Handed, json.loads(text))
    return Path(handed.folder), Recording(RecordSettings.from_dict(handed.settings), parse(SinkSpec, handed.sinks))
