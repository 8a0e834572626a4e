"""What attach looks at once the user's script has ended: loaders of its own, and workers left running.

Loaders of its own (`own_loaders`): a script that iterated no DataLoader may iterate something else
(a `torchdata.nodes.Loader`, a class of its own). Watching every iteration (`sys.setprofile`) would
slow the whole script, so attach looks once, at the end, in the namespaces the script leaves (its
module's globals and, when it raised, its traceback's frames) for a loader-like object or class:
its name says Loader or Pipeline, it has `__iter__`, it is no torch DataLoader.

Workers left running (`stop_workers`): the interpreter's exit would stop them, but attach goes on to
write its results, so it stops them itself: SIGTERM, then SIGKILL.

Ctrl-C and SIGTERM while the script runs (`workers_end_quietly`, `ScriptStop`):
- torch's SIGCHLD handler raises "DataLoader worker (pid N) is killed by signal" wherever the main
  thread is when a worker dies. Once the script is terminated its workers' deaths are expected, so
  the SIGTERM handler disarms that check, and kills the workers at once: a worker left running while
  the script unwinds prints multiprocessing's traceback when the script's end cuts its shared-memory
  handshake (`resource_sharer._serve`).
- The signal lands between any two bytecodes, torch's own included: it can leave a queue's lock held
  (torch's shutdown then waits forever on it), or raise out of a `__del__` or an at-fork hook, where
  Python swallows it and the script runs on (issue 55). So at the signal every live multiprocessing
  iterator is abandoned (`abandon_iterators`) and its workers ended by multiprocessing
  (`stop_workers`); a signal's exception that Python swallows is handed on as the signal again.
- A second signal first writes every thread's stack to stderr (faulthandler), then acts as the first;
  and a watchdog writes them once attach has taken HANG_DUMP_S to end (`hang_shows_itself`).
"""

import _thread
import faulthandler
import gc
import linecache
import multiprocessing
import os
import re
import signal
import sys
import threading
import traceback
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any, Dict, Iterator, List, Mapping, Optional

from torch.utils.data import DataLoader
from torch.utils.data import _utils as torch_data_utils
from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

from pipebench.base.errors import Terminated

__all__ = ["HANG_DUMP_S", "LOADER_LIKE", "ScriptStop", "abandon_iterators", "hang_shows_itself", "own_loaders",
           "script_namespaces", "stop_workers", "without_handler", "workers_end_quietly"]

# A class whose name says it loads or pipes batches (torchdata.nodes.Loader, MyDataPipeline, ...).
LOADER_LIKE = re.compile(r"loader|pipeline", re.IGNORECASE)
# How long a worker gets to exit after SIGTERM before SIGKILL: torch's worker handles SIGTERM at once.
WORKER_EXIT_S = 2.0
# At most this many loader-likes are named in attach's one line.
NAMED_AT_MOST = 3
# From a signal that ends the script, how long attach may take to end before every thread's stack is
# written to stderr: writing the results and report.md takes a few seconds on the loaded 2-core
# machine, so a minute is a hang (issue 55's was killed after 120 s with nothing to show where).
HANG_DUMP_S = 60.0
# A signal's exception swallowed by Python is handed on again this much later, from a thread: handed
# on at once, it would be raised in the hook that saw it swallowed, and swallowed there too.
HAND_ON_S = 0.001


def script_namespaces(script_globals: Optional[Mapping[str, Any]], tb: Optional[TracebackType],
                      script_file: str) -> List[Mapping[str, Any]]:
    """The namespaces the script left: its module's globals (when it returned), and the globals and
    locals of the traceback's frames in the script's own file (when it raised)."""
    spaces: List[Mapping[str, Any]] = [script_globals] if script_globals is not None else []
    for frame, _ in traceback.walk_tb(tb):
        if os.path.abspath(frame.f_code.co_filename) == os.path.abspath(script_file):
            spaces.extend((frame.f_globals, frame.f_locals))
    return spaces


def _loader_like_class(cls: Any) -> bool:
    return (isinstance(cls, type) and bool(LOADER_LIKE.search(cls.__name__)) and hasattr(cls, "__iter__")
            and not issubclass(cls, (DataLoader, _BaseDataLoaderIter)))


def _where(cls: type) -> str:
    """`file:line` of the class's `class` statement: found from its methods' file (a script run by
    runpy is no importable module, so inspect cannot look it up), else the class's module."""
    codes = (getattr(getattr(value, "__func__", value), "__code__", None) for value in vars(cls).values())
    code = next((code for code in codes if code is not None), None)
    if code is None:
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


def abandon_iterators() -> int:
    """Every live multiprocessing DataLoader iterator left to `stop_workers`: its shutdown (`__del__`,
    an epoch's end) made a no-op, so it never puts into a queue whose lock an interrupt may hold, nor
    prints from a `__del__`; its queues never joined at exit; its workers' pids out of torch's SIGCHLD
    check. It still delivers its batches. How many."""
    # type(), not isinstance(): an object's __class__ may be a property (torch's deprecated module
    # attributes warn when read), and the scan reads every object the process holds.
    found = [o for o in gc.get_objects() if issubclass(type(o), _MultiProcessingDataLoaderIter)]
    for iterator in found:
        # Its shutdown made a no-op for this instance (torch's `_shutdown` flag would also stop the
        # iterator from delivering, where the script goes on: its exception swallowed, then raised again).
        iterator._shutdown_workers = lambda: None  # its workers are `stop_workers`'
        queues = [*getattr(iterator, "_index_queues", []), getattr(iterator, "_worker_result_queue", None)]
        for queue in queues:
            if queue is not None:
                queue.cancel_join_thread()
        if getattr(iterator, "_worker_pids_set", False):
            torch_data_utils.signal_handling._remove_worker_pids(id(iterator))
            iterator._worker_pids_set = False
        done = getattr(iterator, "_pin_memory_thread_done_event", None)
        if done is not None:
            done.set()
    return len(found)


def _ignore_child(signum: int, frame: Optional[FrameType]) -> None:
    """SIGCHLD once the script is terminated: its workers' deaths are expected. A Python handler, not
    SIG_DFL: Python prints "Signal 17 ignored due to race condition" for a SIGCHLD already pending
    when its handler becomes SIG_DFL."""


# The signal whose Python exception each is, to hand a swallowed one on as the signal again.
SIGNAL_OF = {KeyboardInterrupt: signal.SIGINT, Terminated: signal.SIGTERM}


class ScriptStop:
    """The script's SIGINT and SIGTERM handler while attach runs it (see the module's docstring): the
    first ends the script, as KeyboardInterrupt or Terminated (cli/main.py's), its loaders' iterators
    abandoned first; each later one writes every thread's stack to stderr, then does the same. Where
    Python swallows the exception ("Exception ignored in ..."), `swallowed` hands the signal on again.
    In a process forked from this one (a worker before its own loop takes over), it acts as Python's
    defaults would."""

    def __init__(self) -> None:
        self.taken = 0
        self.pid = os.getpid()
        # A signal handed on again (its exception was swallowed): raised again, not counted again.
        self.again: Optional[int] = None

    def __call__(self, signum: int, frame: Optional[FrameType]) -> None:
        if os.getpid() != self.pid:  # a forked child: Python's own behaviour
            if signum == signal.SIGTERM:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            raise KeyboardInterrupt
        if self.again == signum:
            self.again = None
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt
        self.taken += 1
        if self.taken > 1:
            print(f"pipebench attach: signal {signal.Signals(signum).name} again; every thread's stack:",
                  file=sys.stderr, flush=True)
            faulthandler.dump_traceback(all_threads=True)
        else:
            faulthandler.dump_traceback_later(HANG_DUMP_S)
        try:
            abandon_iterators()
            if signum == signal.SIGTERM:  # torch's check of its workers disarmed, the workers killed
                signal.signal(signal.SIGCHLD, _ignore_child)
                for process in multiprocessing.active_children():
                    process.kill()
        finally:
            handled = sys.exc_info()[1]  # the first signal's exception, where the script's `except` runs
            if handled is not None:
                without_handler(handled.__traceback__)
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt

    def swallowed(self, unraisable: Any) -> bool:
        """`sys.unraisablehook`'s part: whether the exception Python is about to print and swallow is
        one this handler raised; if so, its signal is handed on again (and nothing is printed)."""
        signum = SIGNAL_OF.get(type(unraisable.exc_value))
        if signum is None:
            return False
        if os.getpid() != self.pid:  # a worker forked as the signal came: it is stopped with the rest
            return True
        if not self.taken:
            return False
        self.again = signum
        if not sys.is_finalizing():  # handed on from a thread, once the main thread has left the swallowing place
            threading.Timer(HAND_ON_S, _thread.interrupt_main, (signum,)).start()
        return True


def without_handler(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    """The traceback less its last frame where that is `ScriptStop`'s, which raised the
    KeyboardInterrupt (or Terminated): Python's own handler raises it with no frame of its own."""
    if tb is None or tb.tb_frame.f_code is ScriptStop.__call__.__code__:
        return None
    last = tb
    while last.tb_next is not None and last.tb_next.tb_frame.f_code is not ScriptStop.__call__.__code__:
        last = last.tb_next
    last.tb_next = None
    return tb


@contextmanager
def workers_end_quietly() -> Iterator[ScriptStop]:
    """Within the block, SIGINT and SIGTERM end the script (KeyboardInterrupt, Terminated) with its
    loaders abandoned and without torch's "DataLoader worker is killed by signal" from its workers'
    deaths (`ScriptStop`; the module's docstring). A script that sets a handler of its own keeps it."""
    stop = ScriptStop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    hook = sys.unraisablehook

    def unraisable(seen: Any) -> None:
        if not stop.swallowed(seen):
            hook(seen)

    sys.unraisablehook = unraisable
    try:
        yield stop
    finally:
        sys.unraisablehook = hook
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def hang_shows_itself() -> Iterator[None]:
    """The block is attach's run: the watchdog a signal arms (every thread's stack written to stderr
    HANG_DUMP_S after it, `ScriptStop`) is cancelled once attach has ended."""
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
