"""Files that are whole or absent: atomic writes with temp names no other writer shares, and folder names.

Readers of summary.csv or result.json run while a sweep writes them (report, compare, a second
run resuming), so every file appears in one rename. Each writer gets its own temp file in the
target's folder, so two writers of one path never rename each other's half-written file.
"""

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Mapping

__all__ = ["folder_safe", "write_bytes_atomic", "write_json_atomic", "write_text_atomic"]


def folder_safe(text: str) -> str:
    """`text` with every character a folder name should not carry removed."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "", text)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so readers see the old file or the new one, never a part. A symlink
    planted at `path` is replaced, never followed."""
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, payload: Mapping[str, object]) -> None:
    write_text_atomic(path, json.dumps(payload, indent=1, default=str))
