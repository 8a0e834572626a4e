"""What `pipebench tune` will search: its `tune.*` options, the space's dimensions, and each point as a config.

Each point reaches its jobs as a Hydra "experiment" config in the ConfigStore (`+tune_point=<name>`,
package `_global_`), so a stage of the race is one sweep over the point names, interleaved round by
round as `pipebench run` runs any sweep; the job processes get the configs with Hydra's own state.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.config_store import ConfigStore

from pipebench.base.errors import ConfigError
from pipebench.config.limits import MAX_BATCH_SIZE, MAX_PREFETCH_FACTOR, MAX_REPEATS, MAX_WORKERS
from pipebench.config.specs import TRANSFORM_GROUP, JobSpec, bounded
from pipebench.config.sweep_axes import worker_ladder
from pipebench.explore.plan import unset_defaults
from pipebench.record.jobs import override_key
from pipebench.tune.race import Schedule
from pipebench.tune.space import SETTING_KEYS, Dimensions, Point

__all__ = ["OPTUNA", "POINT_GROUP", "RACE", "ROUND_DEFAULTS", "TUNE_PREFIX", "TuneOptions", "current_point",
           "dimensions", "job_overrides", "point_override", "round_settings", "store_chain", "store_point"]

TUNE_PREFIX = "tune."
# The ConfigStore group of the points (`+tune_point=<name>`); their chains are in TRANSFORM_GROUP.
POINT_GROUP = "tune_point"
PROVIDER = "pipebench tune"
RACE, OPTUNA = "race", "optuna"
SEARCHES = (RACE, OPTUNA)
# A round of stage 1 unless the command line sets the run's length (`run=quick`, `run.min_time_s=...`):
# as explore's, short jobs (more rounds of short jobs resist drift better than fewer long ones), no
# profiler trace (its extra steps cost time a job), two worker cycles (a rate's interval needs two).
ROUND_DEFAULTS = (("run.steps", "10"), ("run.min_time_s", "1"), ("run.worker_cycles", "2"), ("trace", "none"),
                  ("run.profile_steps", "0"))
# The run keys a round's length scales, from the values stage 1's round composes to.
ROUND_SCALED = ("run.min_time_s", "run.steps")
# Each step's thread profile: the probe's alone (tune's GIL rule reads it); a race round never runs it.
THREAD_PROFILE = "run.thread_profile"


@dataclass
class TuneOptions:
    """`tune.*`: the space and the race. A null dimension takes what the host and the dataset allow."""

    # race: the model-pruned race; optuna: Optuna's TPE sampler picks which points enter it.
    search: str = RACE
    # null: the model's ladder, from the probe (pipebench.tune.space.ladder_top: up to the knee of a
    # chain that waits, bounded by memory and a cap; twice the usable cores before the probe).
    workers: Optional[List[int]] = None
    # null: every installed backend that can read the dataset.
    backends: Optional[List[str]] = None
    # DataLoader's default and twice it (explore's prefetch move).
    prefetch_factors: List[int] = field(default_factory=lambda: [2, 4])
    persistent_workers: List[bool] = field(default_factory=lambda: [False, True])
    # null: off and on where CUDA is (on without CUDA is pruned: it changes nothing).
    pin_memory: Optional[List[bool]] = None
    # null: the config's batch size only; the batch size changes what the model trains on, so only
    # a user who allows it has it searched.
    batch_sizes: Optional[List[int]] = None
    # explore's equivalent chain variants: the probe measures each at workers=0 and keeps its winners.
    variants: bool = True
    # The most chains kept from the probe (the fastest within noise of the best).
    max_chains: int = 2
    rounds: int = 2
    stages: int = 3
    # Interleaved rounds a side for the winner against the current settings; 0: no verification.
    verify_rounds: int = 4
    # Optuna: points its sampler proposes a batch, and the sampler's seed.
    optuna_batch: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.search not in SEARCHES:
            raise _bad("search", f"must be one of {', '.join(SEARCHES)}, got {self.search!r}")
        for key in ("workers", "backends", "prefetch_factors", "persistent_workers", "pin_memory", "batch_sizes"):
            if getattr(self, key) == []:
                raise _bad(key, "must list at least one value")
        for key, low, high in (("workers", 0, MAX_WORKERS), ("prefetch_factors", 1, MAX_PREFETCH_FACTOR),
                               ("batch_sizes", 1, MAX_BATCH_SIZE)):
            for value in getattr(self, key) or ():
                bounded(TUNE_PREFIX + key, value, low, high)
        # Rounds, stages, chains and a batch of points each multiply the search's measurement.
        for key, low in (("max_chains", 1), ("rounds", 1), ("stages", 1), ("verify_rounds", 0), ("optuna_batch", 1)):
            bounded(TUNE_PREFIX + key, getattr(self, key), low, MAX_REPEATS)

    def schedule(self, round_s: float, job_s: float) -> Schedule:
        return Schedule(self.rounds, self.stages, round_s=round_s, job_s=job_s)


def _bad(key: str, why: str) -> ConfigError:
    return ConfigError(f"{TUNE_PREFIX}{key}: {why}")


def current_point(spec: JobSpec) -> Point:
    """The user's settings as a point: what the winner is verified against."""
    return Point(spec.transform_name, spec.workers, spec.loader.backend, spec.loader.prefetch_factor,
                 spec.loader.persistent_workers, spec.loader.pin_memory, spec.loader.batch_size)


def dimensions(options: TuneOptions, spec: JobSpec, chains: Sequence[str], usable_cores: int,
               backends: Sequence[str]) -> Dimensions:
    """The values each setting may take: the options', else the host's (`backends`: those installed
    that can read the dataset)."""
    unknown = [b for b in options.backends or () if b not in backends]
    if unknown:
        raise _bad("backends", f"{', '.join(unknown)} cannot run here (installed and able to read this dataset: "
                               f"{', '.join(backends)})")
    return Dimensions(
        chains=tuple(chains),
        workers=tuple(sorted(set(options.workers or worker_ladder(usable_cores)))),
        backends=tuple(options.backends or backends),
        prefetch_factors=tuple(sorted(set(options.prefetch_factors))),
        persistent_workers=tuple(dict.fromkeys(options.persistent_workers)),
        pin_memory=tuple(dict.fromkeys(options.pin_memory if options.pin_memory is not None else (False, True))),
        batch_sizes=tuple(sorted(set(options.batch_sizes or [spec.loader.batch_size]))),
    )


def job_overrides(overrides: Sequence[str]) -> List[str]:
    """The user's overrides less the keys a point sets (SETTING_KEYS: on the command line they would win
    over the point's config; they name the user's current settings, verified against) and those
    `round_settings` gives each round (its length, ROUND_SCALED, and whether it profiles threads)."""
    return [o for o in overrides if override_key(o) not in (*SETTING_KEYS, *ROUND_SCALED, THREAD_PROFILE)]


def round_settings(overrides: Sequence[str], round_spec: JobSpec, length: float, thread_profile: bool = False
                   ) -> List[str]:
    """The run overrides of a round `length` times stage 1's, whose run settings `round_spec` holds
    (composed with ROUND_DEFAULTS): its window's time and steps scaled; the thread profile only
    where asked (the probe), as it adds seconds a job under a thread backend."""
    defaults = unset_defaults(ROUND_DEFAULTS, overrides)
    return [*(o for o in defaults if override_key(o) not in (THREAD_PROFILE, *ROUND_SCALED)),
            f"{THREAD_PROFILE}={str(thread_profile).lower()}",
            f"run.min_time_s={round_spec.run.min_time_s * length:g}", f"run.steps={math.ceil(round_spec.run.steps * length)}"]


def point_override(names: Sequence[str]) -> str:
    """The sweep over points: `+tune_point=a,b,c`."""
    return f"+{POINT_GROUP}={','.join(names)}"


def store_point(point: Point) -> None:
    """The point as a global config in Hydra's ConfigStore: it selects its chain (a config under
    `transform/`, explore's variants included once stored) and sets the workers and loader keys."""
    loader = {key.partition(".")[2]: value for key, value in point.settings().items() if key.startswith("loader.")}
    node = {"defaults": [{"override /transform": point.chain}, "_self_"], "workers": point.workers, "loader": loader}
    ConfigStore.instance().store(group=POINT_GROUP, name=point.name, node=node, package="_global_",
                                 provider=PROVIDER)


def store_chain(name: str, config: Dict[str, Any]) -> None:
    """An explore variant's chain, as a resumed tune read it from its plan, as `transform=<name>` in
    Hydra's ConfigStore (explore's checks are not run again)."""
    ConfigStore.instance().store(group=TRANSFORM_GROUP, name=name, node=config, provider=PROVIDER)
