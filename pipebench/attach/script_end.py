"""What attach looks at once the user's script has ended: loaders of its own, and workers left running.

Loaders of its own (`own_loaders`): a script that iterated no DataLoader may iterate something
else: a `torchdata.nodes.Loader`, a class of its own with `__iter__` over batches. Watching every
iteration (`sys.setprofile`) would slow the whole script, so attach looks once, at the end, in
the namespaces the script leaves: its module's globals and, when it ended in an exception
(`sys.exit` included), the globals and locals of every frame of its traceback. A name there that
holds an object whose class is loader-like (its name says Loader or Pipeline, it has `__iter__`,
it is no torch DataLoader), or holds such a class itself (defined or imported by the script), is
reported. Not seen: an object that only a function which returned held, whose class the
script's module neither defines nor imports by name (`import torchdata.nodes as tn` names no class).

Workers left running (`stop_workers`): DataLoader workers whose loader the script still held when
it ended (a persistent loader in a global). Without attach the interpreter's exit would stop
them; attach goes on to write its results, so it stops them itself: SIGTERM, then SIGKILL.

Workers ended by a SIGTERM to attach's process group (`workers_end_quietly`): torch's SIGCHLD
handler raises "DataLoader worker (pid N) is killed by signal" wherever the main thread is when a
worker dies, in the script's unwinding, in gc, in a loader's `__del__` (Python's 20-line "Exception
ignored"). Once the script is terminated its workers' deaths are expected, so the SIGTERM handler
disarms that check before it ends the script. A SIGTERM to attach alone is sent on to the workers
at once, as one to the group would be: a worker left running while the script unwinds may be
handing a batch's shared memory to it, and prints multiprocessing's traceback (ConnectionResetError)
when the script's end cuts that handshake.
"""

import linecache
import multiprocessing
import os
import re
import signal
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any, Dict, Iterator, List, Mapping, Optional

from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from pipebench.base.errors import Terminated

__all__ = ["LOADER_LIKE", "own_loaders", "script_namespaces", "stop_workers", "workers_end_quietly"]

# A class whose name says it loads or pipes batches (torchdata.nodes.Loader, MyDataPipeline, ...).
LOADER_LIKE = re.compile(r"loader|pipeline", re.IGNORECASE)
# How long a worker gets to exit after SIGTERM before SIGKILL: torch's worker handles SIGTERM at once.
WORKER_EXIT_S = 2.0
# At most this many loader-likes are named in attach's one line.
NAMED_AT_MOST = 3


def script_namespaces(script_globals: Optional[Mapping[str, Any]], tb: Optional[TracebackType],
                      script_file: str) -> List[Mapping[str, Any]]:
    """The namespaces the script left: its module's globals (when it returned), and the globals and
    locals of the traceback's frames in the script's own file (when it raised)."""
    spaces: List[Mapping[str, Any]] = [script_globals] if script_globals is not None else []
    for frame in _frames(tb):
        if os.path.abspath(frame.f_code.co_filename) == os.path.abspath(script_file):
            spaces.extend((frame.f_globals, frame.f_locals))
    return spaces


def _frames(tb: Optional[TracebackType]) -> Iterator[FrameType]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _loader_like_class(cls: Any) -> bool:
    return (isinstance(cls, type) and bool(LOADER_LIKE.search(cls.__name__)) and hasattr(cls, "__iter__")
            and not issubclass(cls, (DataLoader, _BaseDataLoaderIter)))


def _where(cls: type) -> str:
    """`file:line` of the class's `class` statement: found from its methods' file (a script run by
    runpy is no importable module, so inspect cannot look it up), else the class's module."""
    for value in vars(cls).values():
        code = getattr(getattr(value, "__func__", value), "__code__", None)
        if code is not None:
            break
    else:
        return cls.__module__
    statement = re.compile(rf"\s*class\s+{re.escape(cls.__name__)}\b")
    line = next((n for n, text in enumerate(linecache.getlines(code.co_filename), 1) if statement.match(text)), None)
    name = os.path.basename(code.co_filename)
    return f"{name}:{line}" if line else name


def own_loaders(namespaces: List[Mapping[str, Any]]) -> List[str]:
    """One phrase a loader-like seen: `MyLoader object `loader` (class at train.py:12)`, or for a
    class alone `class MyLoader (train.py:12)`; objects first, each class once."""
    objects: Dict[type, str] = {}
    classes: Dict[type, str] = {}
    for space in namespaces:
        for name, value in list(space.items()):
            if _loader_like_class(type(value)):
                objects.setdefault(type(value), name)
            elif _loader_like_class(value):
                classes.setdefault(value, name)
    seen = [f"{cls.__name__} object `{name}` (class at {_where(cls)})" for cls, name in objects.items()]
    seen += [f"class {cls.__name__} ({_where(cls)})" for cls in classes if cls not in objects]
    return seen[:NAMED_AT_MOST]


def stop_workers() -> int:
    """Stop the multiprocessing children still running (the script's DataLoader workers); how many.
    Through multiprocessing's own terminate/join, not psutil's reaping as `base.descendants.end_descendants`
    does: a worker reaped behind multiprocessing's back reads as alive to it forever, and torch's
    shutdown would later signal its (possibly reused) pid."""
    left = [p for p in multiprocessing.active_children() if p.is_alive()]
    for process in left:
        process.terminate()
    for process in left:
        process.join(WORKER_EXIT_S)
        if process.is_alive():
            process.kill()
            process.join(WORKER_EXIT_S)
    return len(left)


def _terminate_script(signum: int, frame: object) -> None:
    """SIGTERM: torch's check of its workers disarmed, the workers sent SIGTERM too (as a SIGTERM to
    the group sends it), then Terminated, as cli/main.py's handler raises it; raised even if the
    check fires before it is disarmed."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for process in multiprocessing.active_children():
            process.terminate()
    finally:
        raise Terminated()


@contextmanager
def workers_end_quietly() -> Iterator[None]:
    """Within the block, SIGTERM ends the script with Terminated and without torch's "DataLoader
    worker is killed by signal" from its workers' deaths (see the module's docstring). A script
    that sets a SIGTERM handler of its own keeps it."""
    previous = signal.signal(signal.SIGTERM, _terminate_script)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
