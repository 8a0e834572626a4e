"""`pipebench attach -- python FLAGS ...`: the interpreter's flags read as CPython's getopt reads them,
and attach run again under them (pipebench.cli.attach_python), issue 55.2."""

import sys

import pytest

from pipebench.base.command import CLI_MODULE
from pipebench.base.errors import ConfigError
from pipebench.cli.attach import parse_command, run_script
from pipebench.cli.attach_python import PythonCommand, python_flags, rerun_argv, split_python


@pytest.mark.parametrize("words, flags, rest", [
    (["-u", "train.py", "--lr", "1"], ("-u",), ("train.py", "--lr", "1")),
    # Grouped short options, and an option that takes the rest of its word or the next word.
    (["-uB", "-OO", "-Wignore", "-W", "error::DeprecationWarning", "-X", "dev", "-Xutf8", "t.py"],
     ("-u", "-B", "-O", "-O", "-W", "ignore", "-W", "error::DeprecationWarning", "-X", "dev", "-X", "utf8"), ("t.py",)),
    (["-E", "-s", "-I", "-P", "-q", "-v", "-b", "-d", "-R", "t.py", "-u"],
     ("-E", "-s", "-I", "-P", "-q", "-v", "-b", "-d", "-R"), ("t.py", "-u")),
    # -m and -c end the options: what follows is the target's argv, options or not.
    (["-u", "-m", "pkg.train", "-u", "-X", "x"], ("-u",), ("-m", "pkg.train", "-u", "-X", "x")),
    (["-um", "pkg.train"], ("-u",), ("-m", "pkg.train")),
    (["-mpkg.train", "a"], (), ("-m", "pkg.train", "a")),
    (["-O", "-c", "print(1)", "a"], ("-O",), ("-c", "print(1)", "a")),
    (["-uc", "print(1)"], ("-u",), ("-c", "print(1)")),
    (["--check-hash-based-pycs", "never", "--check-hash-based-pycs=always", "t.py"],
     ("--check-hash-based-pycs", "never", "--check-hash-based-pycs", "always"), ("t.py",)),
    (["-u", "--", "-odd-name.py"], ("-u",), ("-odd-name.py",)),
    (["t.py"], (), ("t.py",)),
])
def test_the_interpreters_flags_are_read_as_python_reads_them(words, flags, rest):
    assert split_python(words) == PythonCommand(flags, rest)


@pytest.mark.parametrize("words, said", [
    (["-W"], "-W needs an argument"),
    (["-X"], "-X needs an argument"),
    (["-m"], "-m needs a module name"),
    (["-u", "-c"], "-c needs code"),
    (["-k", "t.py"], "unknown interpreter option -k"),
    (["--nope", "t.py"], "unknown interpreter option --nope"),
    (["--check-hash-based-pycs"], "needs an argument"),
    (["-", "a"], "reads the script from stdin"),
    (["-i", "t.py"], "-i opens Python's prompt"),
    (["-uS", "t.py"], "-S leaves site-packages out"),
    (["-V"], "runs no script"),
    (["--version"], "runs no script"),
])
def test_a_flag_attach_cannot_pass_on_is_one_line(words, said):
    with pytest.raises(ConfigError, match=said.replace("-", r"\-")):
        split_python(words)


def test_a_command_with_flags_runs_attach_again_under_them_and_one_without_does_not():
    command = ["--", "python3", "-u", "-X", "dev", "train.py", "--epochs", "1"]
    words = ["attach", "--steps", "20", "--out", "o", *command]
    name, parsed = python_flags(command)
    argv = rerun_argv(words, command, name, parsed)
    assert argv == [sys.executable, "-u", "-X", "dev", "-m", CLI_MODULE, "attach", "--steps", "20", "--out", "o",
                    "--", "python3", "train.py", "--epochs", "1"]
    # argparse may have dropped the `--`: attach puts one back before the command.
    assert rerun_argv(words[:5] + command[1:], command[1:], name, parsed)[6:] == argv[6:]
    # The rerun's own command has no flags left, so it runs the script, never itself again.
    assert python_flags(argv[argv.index("--") + 1:]) is None
    assert python_flags(["python", "train.py"]) is None and python_flags(["torchrun", "-u", "t.py"]) is None
    with pytest.raises(ConfigError, match="from its command line"):  # called from Python with other words
        rerun_argv(["attach", "--", "x.py"], command, name, parsed)


def test_parse_command_reads_c_code_and_refuses_flags_it_was_not_run_under(tmp_path):
    assert parse_command(["--", "python", "-c", "print(1)", "a"]) == ("code", "print(1)", ["a"])
    assert parse_command(["python", "-m", "pkg.train", "-u"]) == ("module", "pkg.train", ["-u"])
    with pytest.raises(ConfigError, match="only as the command"):
        parse_command(["python", "-u", "train.py"])


def test_c_code_runs_as_main_with_its_argv(capsys):
    assert run_script("code", "import sys; print(__name__, sys.argv); sys.exit(3)", ["a", "b"]) == 3
    assert capsys.readouterr().out.strip() == "__main__ ['-c', 'a', 'b']"
