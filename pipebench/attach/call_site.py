"""Where a DataLoader was created or iterated, in the user's own code: the line a loader is named by.

A loader built inside a library (timm's `create_loader`, webdataset's `WebLoader`) would otherwise be
named by the library's line, the same for every script. The stack is walked outwards past torch's and
pipebench's frames and a DataLoader subclass's own methods to the first frame of the user's own code
(not installed, not the standard library, not frozen); the library's line that came first is kept
beside it (`CallSite.library`), so a factory's loader reads `train.py:120` by way of `loader.py:467`.
"""

import os
import site
import sysconfig
from dataclasses import dataclass
from types import FrameType
from typing import Any, Optional, Sequence, Tuple

import torch

__all__ = ["CallSite", "LIBRARY_DIRS", "PASSED_DIRS", "UNKNOWN_SITE", "call_site", "user_code"]

# Frames never named, user's or library's: torch's own and pipebench's (`pipebench.watch`, the patched methods).
PASSED_DIRS = (os.path.dirname(torch.__file__) + os.sep,
               os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)


def _library_dirs() -> Tuple[str, ...]:
    """The folders installed code lives in: the standard library and every site-packages folder."""
    paths = sysconfig.get_paths()
    found = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    found.update(getattr(site, "getsitepackages", lambda: [])())
    if site.ENABLE_USER_SITE and site.USER_SITE:
        found.add(site.USER_SITE)
    return tuple(sorted(os.path.join(os.path.realpath(d), "") for d in found))


# Installed code's folders (computed once at import: they do not change while a script runs).
LIBRARY_DIRS = _library_dirs()
# Folder names that hold installed packages wherever they sit (a conda env, a Debian python, a zipapp).
PACKAGE_FOLDERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
# Where no frame of the stack qualifies (a loader made by the interpreter's own teardown, say).
UNKNOWN_SITE = "unknown:0"


@dataclass(frozen=True)
class CallSite:
    """`file:line` of the user's own frame (`user`), and of the library's frame that made the call on
    its behalf where one came first (`library`; None when the user's code made it itself)."""

    user: str
    library: Optional[str] = None


def user_code(filename: str, library_dirs: Sequence[str] = LIBRARY_DIRS) -> bool:
    """Whether a frame's file is the user's own code: not installed (site-packages, the standard
    library) and not frozen (`<frozen runpy>`); `-c` code (`<string>`) is the user's."""
    if filename.startswith("<frozen"):
        return False
    if filename.startswith("<"):
        return True
    path = os.path.realpath(filename)
    return not path.startswith(tuple(library_dirs)) and not any(folder in path for folder in PACKAGE_FOLDERS)


def _named(frame: Any) -> str:
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def call_site(frame: Optional[FrameType], loader_type: type, passed: Sequence[str] = PASSED_DIRS,
              library_dirs: Sequence[str] = LIBRARY_DIRS) -> CallSite:
    """The CallSite of the call `frame` is in: outwards from it, the frames in `passed` folders and
    methods of a `loader_type` (a subclass's `__init__` or `__iter__`) are stepped over; the first
    other frame is the library's where it is not the user's code, and the first frame of the user's
    code names the site. No user frame at all: the library's line alone names it."""
    library = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(tuple(passed)) and not isinstance(frame.f_locals.get("self"), loader_type):
            if user_code(filename, library_dirs):
                return CallSite(_named(frame), library)
            library = library or _named(frame)
        frame = frame.f_back
    return CallSite(library or UNKNOWN_SITE)
