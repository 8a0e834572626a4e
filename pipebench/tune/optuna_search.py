"""`tune.search=optuna`: Optuna's TPE sampler picks which points enter the race, a batch at a time,
for a space larger than one round of the budget. Each setting is one categorical dimension, so TPE
learns per setting; a combination the model pruned is told PRUNED without running, so the sampler
learns to avoid it. Optuna is optional: without it, one line names the install.
"""

import statistics
from typing import Dict, List, Mapping, Optional, Sequence, Set

from pipebench.base.errors import ConfigError
from pipebench.base.extras import MissingExtra, installed, missing_line
from pipebench.tune.objective import Objective, Round, race_rates
from pipebench.tune.race import Propose
from pipebench.tune.space import Point

__all__ = ["LIBRARY", "optuna_missing", "optuna_proposer"]

LIBRARY = "optuna"
# pipebench's extra that installs it.
EXTRA = "tune"
# Asks a batch may spend on combinations the model pruned or the race has seen, before the study is
# taken to have nothing new to propose (the pruned space is smaller than the grid it samples).
ASKS_PER_POINT = 25
FIELDS = ("chain", "workers", "backend", "prefetch_factor", "persistent_workers", "pin_memory", "batch_size")


def optuna_missing() -> Optional[ConfigError]:
    """The one-line error for tune.search=optuna without Optuna; None where it is installed."""
    if installed(LIBRARY):
        return None
    return ConfigError(f"{missing_line([MissingExtra('tune.search=optuna', 'Optuna', EXTRA)])} "
                       "(or leave tune.search at race, the default)")


def _value(objective: Objective, point: Point, rounds: Sequence[Round]) -> Optional[float]:
    """What the study maximises for a measured point: its rate, or fewer workers first under a starvation
    target; None when it misses the objective's limits (told PRUNED)."""
    if objective.unmet(rounds):
        return None
    rate = statistics.median(race_rates(rounds))
    if objective.target_starvation_pct is not None:
        return -point.workers + rate / (1.0 + rate)  # fewer workers first, then the faster (below 1)
    return rate


def optuna_proposer(points: Sequence[Point], objective: Objective, batch: int, seed: int) -> Propose:
    """A `propose` for run_race: batches of the pruned `points`, by the TPE sampler's choice."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    choices = {name: sorted({getattr(p, name) for p in points}, key=str) for name in FIELDS}
    by_values = {tuple(getattr(p, name) for name in FIELDS): p for p in points}
    pending: Dict[str, "optuna.trial.Trial"] = {}
    proposed: Set[str] = set()

    def propose(rounds: Mapping[str, Sequence[Round]], best: Optional[str]) -> List[str]:
        for name in list(pending):
            trial = pending.pop(name)
            value = _value(objective, next(p for p in points if p.name == name), rounds.get(name, ()))\
                if rounds.get(name) else None
            study.tell(trial, value, state=None if value is not None else optuna.trial.TrialState.PRUNED)
        picked: List[str] = []
        asks = 0
        while len(picked) < batch and len(proposed) < len(points) and asks < ASKS_PER_POINT * batch:
            asks += 1
            trial = study.ask()
            values = tuple(trial.suggest_categorical(name, choices[name]) for name in FIELDS)
            point = by_values.get(values)
            if point is None or point.name in proposed:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            proposed.add(point.name)
            pending[point.name] = trial
            picked.append(point.name)
        return picked

    return propose
