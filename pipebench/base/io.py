"""Files that are whole or absent, written without following links: atomic writes, and folder names;
and files only appended to, whole lines at a time (`append_lines`).

Readers of summary.csv or result.json run while a sweep writes them (report, compare, a second
run resuming), so every file appears in one rename. Each writer gets a new file of its own in the
target's folder, so two writers of one path never rename each other's half-written file, and the
rename replaces whatever had the name: a symbolic or hard link planted in a shared results folder
is replaced, never written through. The new file gets the mode a plain open() would give it under
the process umask (0644 under the usual 022), so results shared with a team or CI are readable.
A write that fails names the file it was for, a full disk included.
"""

import json
import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Tuple

__all__ = ["append_lines", "folder_safe", "replacing", "with_name", "write_bytes_atomic", "write_json_atomic",
           "write_text_atomic"]

# The mode open() asks for; the kernel takes the umask off (tempfile.mkstemp asks for 0600).
PLAIN_MODE = 0o666
# Random bytes in a new file's name: no other writer, or a name planted ahead, can share it.
NAME_TOKEN_BYTES = 8


def folder_safe(text: str) -> str:
    """`text` with every character a folder name should not carry removed."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "", text)


def with_name(exc: OSError, path: Path) -> OSError:
    """`exc` naming `path` rather than no file (a write() on a full disk names none) or a temporary one."""
    if exc.filename == str(path) and exc.filename2 is None:
        return exc
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def _new_file(path: Path, suffix: str) -> Tuple[int, Path]:
    """A new file beside `path`, open for writing, and its name: `path.name` hidden, a random token,
    `suffix`. O_EXCL: it is never an existing file or a link planted under that name."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(NAME_TOKEN_BYTES)}{suffix}")
    try:
        return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PLAIN_MODE), tmp
    except OSError as exc:
        raise with_name(exc, path) from None


@contextmanager
def _renamed_over(path: Path, tmp: Path) -> Iterator[None]:
    """Rename `tmp` over `path` when the block ends; remove it if the block raises."""
    try:
        yield
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise with_name(exc, path) from None
        raise


@contextmanager
def replacing(path: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A new, empty file in `path`'s folder for a writer that takes a file name (torch.profiler's
    trace export, a library's save), renamed over `path` when the block ends. `suffix` ends the new
    file's name, for a writer that picks its format by it."""
    fd, tmp = _new_file(path, suffix)
    os.close(fd)
    with _renamed_over(path, tmp):
        yield tmp


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so readers see the old file or the new one, never a part."""
    fd, tmp = _new_file(path, ".tmp")
    with _renamed_over(path, tmp), os.fdopen(fd, "wb") as out:
        out.write(data)


def append_lines(fd: int, text: str) -> None:
    """Append whole lines to a file open with O_APPEND in ONE os.write, then fsync: a crash leaves at
    most a torn last line, and processes appending to one file (a torchrun job's ranks) never
    interleave a line (one write of a short line under O_APPEND lands whole on a local file system)."""
    os.write(fd, text.encode())
    os.fsync(fd)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, payload: Mapping[str, object]) -> None:
    write_text_atomic(path, json.dumps(payload, indent=1, default=str))
