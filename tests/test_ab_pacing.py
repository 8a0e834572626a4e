"""An A/B session's pacing (pipebench.regress.ab, pipebench.measure.round_gate): each side one run,
started once and told round by round when to go, the rounds alternating; a tree without the gate
runs a command a round. The sides here are small scripts that speak the gate as the launcher does,
logging what they do, so the order is known without measuring anything."""

import os
import sys
import threading
from pathlib import Path

import pytest

from pipebench.base.errors import PipebenchError
from pipebench.measure.round_gate import GATE_ENV, gate_env, gate_from_environ, read_number, say_round
from pipebench.regress.ab import Plan, Side, SideFailed, _gated_rounds, _rounds_apart, paced

# A side's "python": the gate probe exits as GATED says; a run logs its start, then each round it
# is let into, and names its folder as `pipebench run` does. FAIL_ROUND fails that round.
FAKE_SIDE = '''#!{python}
import os, sys, time
from pathlib import Path
from pipebench.measure.round_gate import gate_from_environ

GATED, FAIL_ROUND = {gated}, {fail_round}
args = sys.argv[1:]
if args[:2] == ["-c", "import pipebench.measure.round_gate"]:
    sys.exit(0 if GATED else 1)
name = Path(sys.argv[0]).name
settings = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("import"))
log = Path(os.environ["SIDE_LOG"])
with log.open("a") as f:
    f.write(f"start {{name}} {{os.getpid()}}\\n")
gate = gate_from_environ(os.environ)
rounds = [int(settings["run.round"])] if "run.round" in settings else range(int(settings["rounds"]))
for k in rounds:
    if gate is not None:
        gate.enter(k)
    if k == FAIL_ROUND:
        print("boom in round", k, file=sys.stderr)
        sys.exit(3)
    with log.open("a") as f:
        f.write(f"{{name}} {{k}}\\n")
    time.sleep(0.02)  # a round's work: a side let in early would overlap the other's line
print(f"results: {{settings['results_dir']}}/{{name}}-{{rounds[0]}}")
'''


def fake_side(tmp_path: Path, name: str, gated: bool = True, fail_round: int = -1) -> Side:
    script = tmp_path / "bin" / name
    script.parent.mkdir(exist_ok=True)
    script.write_text(FAKE_SIDE.format(python=sys.executable, gated=gated, fail_round=fail_round))
    script.chmod(0o755)
    return Side(name, tmp_path, "0" * 40, str(script))


def session(tmp_path: Path, monkeypatch, rounds: int = 3):
    log = tmp_path / "sides.log"
    monkeypatch.setenv("SIDE_LOG", str(log))
    envs = {name: dict(os.environ) for name in ("base", "head")}
    return Plan(("suite=nightly",), rounds, tmp_path / "session", Path(".")), envs, log


def test_each_side_starts_once_then_the_rounds_alternate_one_side_at_a_time(tmp_path, monkeypatch):
    plan, envs, log = session(tmp_path, monkeypatch)
    sides = (fake_side(tmp_path, "base"), fake_side(tmp_path, "head"))
    assert paced(sides, plan, envs)
    folders = _gated_rounds(sides, plan, envs, progress=lambda *a, **k: None)
    lines = [line.split()[:2] for line in log.read_text().splitlines()]
    assert lines == [["start", "base"], ["start", "head"], ["base", "0"], ["head", "0"], ["head", "1"], ["base", "1"],
                     ["base", "2"], ["head", "2"]]
    assert folders == {name: [(plan.folder / name).resolve() / f"{name}-0"] for name in ("base", "head")}


def test_a_side_that_fails_mid_session_is_named_with_its_round_and_the_other_side_is_ended(tmp_path, monkeypatch):
    plan, envs, log = session(tmp_path, monkeypatch)
    sides = (fake_side(tmp_path, "base"), fake_side(tmp_path, "head", fail_round=1))
    with pytest.raises(SideFailed) as failed:
        _gated_rounds(sides, plan, envs, progress=lambda *a, **k: None)
    assert (failed.value.side, failed.value.round, failed.value.status) == ("head", 1, 3)
    assert failed.value.tail == "boom in round 1"
    base_pid = int(log.read_text().splitlines()[0].split()[2])
    with pytest.raises(ProcessLookupError):  # waiting at its gate for round 1, it was ended and reaped
        os.kill(base_pid, 0)


def test_a_tree_without_the_gate_or_another_launcher_runs_every_round_as_a_command_of_its_own(tmp_path, monkeypatch):
    plan, envs, log = session(tmp_path, monkeypatch, rounds=2)
    sides = (fake_side(tmp_path, "base", gated=False), fake_side(tmp_path, "head"))
    assert not paced(sides, plan, envs)
    folders = _rounds_apart(sides, plan, envs, progress=lambda *a, **k: None)
    lines = [line.split()[:2] for line in log.read_text().splitlines()]
    assert lines == [["start", "base"], ["base", "0"], ["start", "head"], ["head", "0"],
                     ["start", "head"], ["head", "1"], ["start", "base"], ["base", "1"]]
    assert [p.name for p in folders["base"]] == ["base-0", "base-1"]
    both_gated = (fake_side(tmp_path, "base"), sides[1])  # a cluster's launcher would never enter the gate
    assert not paced(both_gated, Plan(("hydra/launcher=submitit_slurm",), 2, plan.folder, Path(".")), envs)


def test_the_gate_says_ready_waits_for_go_and_leaves_nothing_for_the_job_processes(monkeypatch):
    go_read, go_write = os.pipe()
    ready_read, ready_write = os.pipe()
    for fd in (go_read, ready_write):
        os.set_inheritable(fd, True)
    environ = gate_env({"KEEP": "1"}, go_read, ready_write)
    gate = gate_from_environ(environ)
    assert environ == {"KEEP": "1"} and GATE_ENV not in environ
    assert not os.get_inheritable(go_read) and not os.get_inheritable(ready_write)
    entered = threading.Thread(target=gate.enter, args=(3,))
    entered.start()
    assert read_number(ready_read) == 3
    assert entered.is_alive()  # waiting for go
    say_round(go_write, 3)
    entered.join(5)
    assert not entered.is_alive()
    os.close(go_write)  # the session ended: the next round is one line, not a run gone unpaced
    with pytest.raises(PipebenchError, match="session pacing this run's rounds has ended"):
        gate.enter(4)
    for fd in (go_read, ready_read, ready_write):
        os.close(fd)
    assert gate_from_environ({}) is None


def test_the_launcher_enters_its_gate_before_each_rounds_job_process_starts(monkeypatch):
    """Once a round, before the round's job process starts (its imports are the round's own)."""
    from omegaconf import OmegaConf

    import hydra_plugins.pipebench_launcher.subprocess_launcher as launcher_module

    calls = []

    class Gate:
        def enter(self, round_num):
            calls.append(f"gate {round_num}")

    monkeypatch.setattr(launcher_module, "take", lambda ahead: None)
    monkeypatch.setattr(launcher_module, "start_job_process", lambda *a: calls.append("start") or "process")
    monkeypatch.setattr(launcher_module, "warm", lambda *a: None)
    monkeypatch.setattr(launcher_module, "serving", lambda process: True)
    monkeypatch.setattr(launcher_module, "discard", lambda process, kill=True: calls.append("end"))
    monkeypatch.setattr(launcher_module, "run_job", lambda process, payload: calls.append("job") or 0)
    launcher = launcher_module.SubprocessLauncher()
    launcher.gate, launcher.task_function = Gate(), os.getpid
    for round_num in (0, 0, 1, 1):
        launcher._run_job_process(OmegaConf.create({"run": {"round": round_num}, "dataset": {},
                                                    "transform": {"per_sample": [], "per_batch": []}}))
    assert calls == ["gate 0", "start", "job", "job", "gate 1", "end", "start", "job", "job"]
