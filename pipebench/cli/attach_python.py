"""The interpreter's own flags in `pipebench attach -- python FLAGS TARGET ARGS`, read as Python reads them.

attach runs the script in its own interpreter, so a flag that only acts at start-up (`-O`, `-E`, `-I`,
`-X utf8`, `-u`) cannot be applied to it afterwards. A command with flags is therefore run again:
attach replaces itself (`os.execv`, the same process) with `python FLAGS -m pipebench.cli.main` and
its own words, and the command without the flags, so the script runs under exactly the interpreter
it asked for, and so do the workers a spawn start method starts (they inherit the flags from
`sys.flags`). The options are parsed as CPython's getopt parses them (`Python/getopt.c`): short
options may be grouped (`-uB`), an option that takes an argument takes the rest of its word or the
next one (`-Wignore`, `-W ignore`, `-X dev`), and `-c` and `-m` end the options.
"""

import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pipebench.base.command import CLI_MODULE
from pipebench.base.errors import ConfigError

__all__ = ["CODE_FILE", "PYTHON_NAMES", "TARGET_OPTIONS", "PythonCommand", "path_entry",
           "python_flags", "rerun", "rerun_argv", "run_code", "split_python"]

# Interpreter names the command may start with (`pipebench attach -- python train.py`).
PYTHON_NAMES = ("python", "python3", os.path.basename(sys.executable))
# CPython's short options (Python/getopt.c, SHORT_OPTS); those in TAKES_ARGUMENT take one.
SHORT_FLAGS = frozenset("bBdEhiIJOPqRsStuvVWxX?")
TAKES_ARGUMENT = frozenset("WX")
# The options that end the options: what follows is the target's argv.
TARGET_OPTIONS = ("-c", "-m")
# Long options: those that take an argument, and those that need none.
LONG_WITH_ARGUMENT = ("--check-hash-based-pycs",)
LONG_FLAGS = ("--help", "--help-env", "--help-xoptions", "--help-all", "--version")
# Options that run no script (help, version), or whose effect attach cannot give the script, each
# with why: refused with one line rather than silently dropped.
REFUSED = {
    "h": "prints Python's help and runs no script", "?": "prints Python's help and runs no script",
    "V": "prints Python's version and runs no script", "J": "is reserved for Jython",
    "i": "opens Python's prompt after the script, and attach exits once it has written its results",
    "S": "leaves site-packages out of sys.path, where pipebench and torch are installed",
    "x": "skips the script's first line, which attach's runpy reads whole",
}
# The file name Python gives `-c` code's frames (and attach looks for its loaders in).
CODE_FILE = "<string>"


@dataclass(frozen=True)
class PythonCommand:
    """`python FLAGS TARGET...`: the interpreter's flags as given (each option with its argument),
    and the rest: `script.py ARGS`, `-m module ARGS` or `-c code ARGS`."""

    flags: Tuple[str, ...]
    rest: Tuple[str, ...]


def _short(word: str, words: List[str]) -> Tuple[List[str], Optional[str]]:
    """The flags of one word of grouped short options (`-uB`, `-Wignore`), the next words taken as
    arguments where an option needs one; and the target option (`-c`, `-m`) that ends them, if any."""
    flags: List[str] = []
    letters = word[1:]
    for k, letter in enumerate(letters):
        if letter in "cm":
            if letters[k + 1:]:  # `-mmodule`, `-ccode`: the rest of the word is the target
                words.insert(0, letters[k + 1:])
            return flags, f"-{letter}"
        if letter not in SHORT_FLAGS:
            raise ConfigError(f"attach -- python: unknown interpreter option -{letter} (in {word})")
        if letter in REFUSED:
            raise ConfigError(f"attach -- python: -{letter} {REFUSED[letter]}")
        if letter in TAKES_ARGUMENT:
            argument = letters[k + 1:] or (words.pop(0) if words else None)
            if argument is None:
                raise ConfigError(f"attach -- python: -{letter} needs an argument")
            flags += [f"-{letter}", argument]
            return flags, None
        flags.append(f"-{letter}")
    return flags, None


def _long(word: str, words: List[str]) -> List[str]:
    name, equals, value = word.partition("=")
    if name in LONG_FLAGS:
        raise ConfigError(f"attach -- python: {name} runs no script")
    if name not in LONG_WITH_ARGUMENT:
        raise ConfigError(f"attach -- python: unknown interpreter option {name}")
    if not equals:
        if not words:
            raise ConfigError(f"attach -- python: {name} needs an argument")
        value = words.pop(0)
    return [name, value]


def split_python(words: Sequence[str]) -> PythonCommand:
    """The interpreter's flags and the rest of `words` (the words after the interpreter's name).
    Raises ConfigError on an option Python does not know, one missing its argument, one that runs
    no script or that attach cannot give it (REFUSED), and on `-` (a script read from stdin)."""
    rest = list(words)
    flags: List[str] = []
    while rest and rest[0].startswith("-"):
        word = rest.pop(0)
        if word == "--":
            break
        if word == "-":
            raise ConfigError("attach -- python: `-` reads the script from stdin; give attach the script's file")
        if word.startswith("--"):
            flags += _long(word, rest)
            continue
        found, target = _short(word, rest)
        flags += found
        if target is not None:
            if not rest:
                raise ConfigError(f"attach -- python {target} needs " + ("a module name" if target == "-m" else "code"))
            return PythonCommand(tuple(flags), (target, *rest))
    return PythonCommand(tuple(flags), tuple(rest))


def python_flags(command: Sequence[str]) -> Optional[Tuple[str, PythonCommand]]:
    """(the interpreter's name as given, the command read) where `command` is `python FLAGS ...` with
    at least one flag; None for a command without flags, or one that names no interpreter."""
    words = list(command)
    if words[:1] == ["--"]:
        words = words[1:]
    if not words or os.path.basename(words[0]) not in PYTHON_NAMES:
        return None
    parsed = split_python(words[1:])
    return (words[0], parsed) if parsed.flags else None


def rerun_argv(words: Sequence[str], command: Sequence[str], python: str, parsed: PythonCommand) -> List[str]:
    """The argv that runs attach again under the interpreter's flags: `python FLAGS -m CLI_MODULE`,
    attach's own words (`words`, the command line, up to `command`, its last words), then
    `-- python` and the command without its flags."""
    words, command = list(words), list(command)
    if not command or words[len(words) - len(command):] != command:
        raise ConfigError("attach -- python with interpreter flags runs attach again as a command, from its "
                          "command line; called from Python, give the command without them")
    head = words[:len(words) - len(command)]
    if head[-1:] != ["--"]:
        head.append("--")
    return [sys.executable, *parsed.flags, "-m", CLI_MODULE, *head, python, *parsed.rest]


def rerun(argv: Sequence[str]) -> None:
    """Replace this process with `argv` (the same pid: a signal or a wait aimed at attach still finds it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], list(argv))


def path_entry(kind: str, target: str) -> Optional[str]:
    """What Python puts first on sys.path for the target: the script's folder, the current folder
    for `-m`, '' for `-c`; nothing under `-P` or `-I` (sys.flags.safe_path, 3.11+)."""
    if getattr(sys.flags, "safe_path", False):
        return None
    if kind == "path":
        return os.path.dirname(os.path.abspath(target))
    return os.getcwd() if kind == "module" else ""


def run_code(code: str) -> Dict[str, Any]:
    """Run `code` as `python -c code` does, as the module `__main__`; the globals it left (a copy).
    sys.argv is the caller's to set (`['-c', ARGS...]`)."""
    main = types.ModuleType("__main__")
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(compile(code, CODE_FILE, "exec"), main.__dict__)  # noqa: S102 - the user's own -c code
        return dict(main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved
