"""Stored files are data: every JSON file pipebench reads back goes through `read_stored`.

result.json, invocation.json, calibration.json and variants.json carry `schema_version` (`versioned`
adds it). `read_stored` parses JSON and nothing else (no pickle, no YAML, no symbolic link followed),
checks the version and runs the caller's shape check. A file that is not what pipebench wrote (cut
short, not UTF-8, not an object, a key missing or of the wrong kind, figures that contradict each
other) raises `DamagedFile`, one from a newer pipebench `NewerFile`: one line naming the file and why.
"""

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Mapping

from pipebench.base.errors import PipebenchError

__all__ = ["NUMBER", "OBJECT", "TEXT", "TEXTS", "WHOLE", "DamagedFile", "Kind", "Malformed", "NewerFile",
           "RESULTS_SCHEMA_VERSION", "SCHEMA_VERSION_KEY", "check_fields", "describe", "finite_positive",
           "list_of", "optional", "read_stored", "versioned"]

# Raise it when a stored file changes meaning (a key renamed, a unit changed); readers refuse
# files of a higher version rather than misread them.
RESULTS_SCHEMA_VERSION = 1
SCHEMA_VERSION_KEY = "schema_version"
# Files written before the version existed carry none; they are version 1.
UNVERSIONED = 1


class DamagedFile(PipebenchError):
    """A stored file that is not what pipebench wrote."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class NewerFile(PipebenchError):
    """A stored file written by a newer pipebench, with a schema this one does not know."""


class Malformed(ValueError):
    """What a shape check found wrong; `read_stored` adds the file's name."""


def versioned(payload: Mapping[str, object]) -> Dict[str, object]:
    """`payload` with this pipebench's schema version, for writing."""
    return {SCHEMA_VERSION_KEY: RESULTS_SCHEMA_VERSION, **payload}


def describe(value: object) -> str:
    """A JSON value's kind in words, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


@dataclass(frozen=True)
class Kind:
    """What a stored value must be: its name in messages, and the test."""

    name: str
    test: Callable[[object], bool]


NUMBER = Kind("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
WHOLE = Kind("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool))
TEXT = Kind("a string", lambda v: isinstance(v, str))
OBJECT = Kind("an object", lambda v: isinstance(v, dict))


def list_of(kind: Kind, name: str = "") -> Kind:
    """An array of `kind`; named `an array of <kind>s` unless `name` says better."""
    return Kind(name or f"an array of {kind.name.partition(' ')[2]}s",
                lambda v: isinstance(v, list) and all(map(kind.test, v)))


def optional(kind: Kind) -> Kind:
    return Kind(f"{kind.name} or null", lambda v: v is None or kind.test(v))


TEXTS = list_of(TEXT)


def check_fields(data: Mapping[str, object], fields: Mapping[str, Kind], where: str = "",
                 required: bool = True) -> None:
    """Each key of `fields` holds its kind; a missing key is wrong only when `required`."""
    for key, kind in fields.items():
        if key not in data:
            if required:
                raise Malformed(f"missing key {where}{key}")
            continue
        if not kind.test(data[key]):
            raise Malformed(f"{where}{key} is {describe(data[key])}, not {kind.name}")


def finite_positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def _parse(raw: bytes) -> object:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Malformed(f"not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        # A cut file began as JSON and stops mid-value, or right after an inner value where more was due.
        stripped = text.strip()
        if stripped.startswith(("{", "[")) and (exc.pos >= len(text.rstrip()) or not stripped.endswith(("}", "]"))):
            raise Malformed(f"truncated JSON (it stops after {len(text.rstrip())} characters, unclosed)") from None
        raise Malformed(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise Malformed("not JSON pipebench wrote (nested too deeply)") from None


def _version(path: Path, data: Mapping[str, object]) -> None:
    version = data.get(SCHEMA_VERSION_KEY, UNVERSIONED)
    if not WHOLE.test(version) or version < UNVERSIONED:
        raise Malformed(f"{SCHEMA_VERSION_KEY} is {version!r}, not a whole number from {UNVERSIONED}")
    if version > RESULTS_SCHEMA_VERSION:
        raise NewerFile(f"{path}: written by a newer pipebench ({SCHEMA_VERSION_KEY} {version}; this one reads up "
                        f"to {RESULTS_SCHEMA_VERSION}); read it with that pipebench")


def read_stored(path: Path, check: Callable[[Dict[str, object]], None] = lambda data: None) -> Dict[str, object]:
    """The JSON object in `path`, version- and `check`-ed. Raises DamagedFile or NewerFile."""
    try:
        if path.is_symlink():  # pipebench writes files, never links: not read through
            raise Malformed(f"a symbolic link to {os.readlink(path)}, not a JSON file pipebench wrote")
        if not path.is_file():
            raise Malformed("not a regular file")
        raw = path.read_bytes()
        data = _parse(raw)
        if not isinstance(data, dict):
            raise Malformed(f"not a JSON object but {describe(data)}")
        _version(path, data)
        check(data)
    except Malformed as exc:
        raise DamagedFile(path, str(exc)) from None
    except OSError as exc:
        raise DamagedFile(path, f"cannot be read ({exc.strerror})") from None
    return data
