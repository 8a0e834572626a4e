"""Frozen, plain-Python job specs built from a composed config, with every value checked.

Configs are resolved to plain Python here, before anything reaches a Dataset or a worker:
DictConfig access in a hot loop is slow, and plain values pickle cheaply under spawn.
Each setting is declared once, here, with its one default: the specs are also the structured configs
Hydra checks a composed config against (pipebench.config.schema), each built from its node by
OmegaConf.to_object and checked by its `__post_init__`, which names the key.
"""

import math
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Mapping, Optional, Tuple, Union

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipebench.base.errors import ConfigError
from pipebench.config.limits import (
    MAX_BATCH_SIZE,
    MAX_PREFETCH_FACTOR,
    MAX_PROFILE_STEPS,
    MAX_RANKS,
    MAX_REPEATS,
    MAX_SEED,
    MAX_STEP_MS,
    MAX_STEPS,
    MAX_STORAGE_LATENCY_MS,
    MAX_STORAGE_MB_PER_S,
    MAX_TIMEOUT_S,
    MAX_WORKERS,
    MIN_STORAGE_MB_PER_S,
)
from pipebench.config.target_node import TargetNode

# The start methods torch.multiprocessing accepts for DataLoader workers.
START_METHODS = ("fork", "spawn", "forkserver")
ON_ERROR_POLICIES = ("fail", "skip")
ON_JOB_ERROR_POLICIES = ("continue", "stop")
# The masked-loss pair (pipebench.pipeline.masked_loss): the version with syncs, then without.
MASKED_LOSS_KINDS = ("masked_loss_sync", "masked_loss_fixed")
# consumer=none: the loader alone, nothing eats the batches (the diagnosis then sizes no consumer).
NO_CONSUMER = "none"
EMULATED = "emulated"
CONSUMER_KINDS = (NO_CONSUMER, EMULATED, "toy_cnn", *MASKED_LOSS_KINDS)
# What stands in a watched loader's consumer column (pipebench attach / watch): the step is the
# user's own code, not one of CONSUMER_KINDS. Here, not beside the watch, so readers need no torch.
USER_STEP = "user_step"
STEP_DISTRIBUTIONS = ("fixed", "normal", "uniform")
# The config group a chain is chosen from (`transform=NAME`), which explore, tune and storage-check
# store into or override; here so that naming it imports none of them.
TRANSFORM_GROUP = "transform"
CONSUMER_DEVICES = ("auto", "cpu", "cuda")
SHARING_STRATEGIES = ("file_descriptor", "file_system")
# loader.backend's choices (pipebench.pipeline.loader_backends), named below the pipeline so a typo is
# one line at compose time, and what `workers=` counts under each, so the meters and the report (which
# imports no torch) tell worker processes from threads of the job's own process.
PROCESSES, THREADS = "processes", "threads"
BACKEND_WORKER_KINDS = {"dataloader": PROCESSES, "threads": THREADS, "spdl": THREADS}
LOADER_BACKENDS = tuple(BACKEND_WORKER_KINDS)
TRACE_KINDS = ("none", "torch", "viztracer")
DISTRIBUTED_BACKENDS = ("auto", "gloo", "nccl")
# dataset.cache (pipebench.config.dataset_groups.FileReading says what each does).
CACHE_MODES = ("warm", "cold")
STORAGE_EMULATION_KEYS = ("latency_ms", "mb_per_s", "shared_mb_per_s")
# run.sync: the step loop (pipebench.measure.repeats).
SYNC_AUTO, SYNC_ASYNC, SYNC_PER_STEP = "auto", "async", "per_step"
SYNC_MODES = (SYNC_AUTO, SYNC_ASYNC, SYNC_PER_STEP)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def bounded(key: str, value: Union[int, float], minimum: float, maximum: float, above: bool = False) -> None:
    """`key` is a finite number from `minimum` (excluded when `above`) to `maximum` (pipebench.config.limits)."""
    _require(not (isinstance(value, float) and not math.isfinite(value)), f"{key} must be a finite number, got {value}")
    low_ok = value > minimum if above else value >= minimum
    _require(low_ok and value <= maximum,
             f"{key} must be {'>' if above else '>='} {minimum:g} and <= {maximum:g}, got {value!r}")


def _one_of(key: str, value: Any, allowed: Tuple[Optional[str], ...]) -> None:
    named = ", ".join(a for a in allowed if a is not None) + (" or null" if None in allowed else "")
    _require(value in allowed, f"{key} must be one of {named}, got {value!r}")


@dataclass(frozen=True)
class Checked:
    """A spec whose `__post_init__` checks each key of RANGES (`bounded`'s minimum, maximum and
    optional `above`; a None value is not checked) and of CHOICES; an error names `PREFIX` + key."""

    PREFIX: ClassVar[str] = ""
    RANGES: ClassVar[Mapping[str, tuple]] = {}
    CHOICES: ClassVar[Mapping[str, tuple]] = {}

    def __post_init__(self) -> None:
        for key, bounds in self.RANGES.items():
            if getattr(self, key) is not None:
                bounded(self.PREFIX + key, getattr(self, key), *bounds)
        for key, allowed in self.CHOICES.items():
            _one_of(self.PREFIX + key, getattr(self, key), allowed)


@dataclass(frozen=True)
class LoaderSpec(Checked):
    """DataLoader settings; `workers` lives at the top level because it is the axis users sweep most."""

    # 32, not the seed's 256: the seed chain costs ~16 ms a sample on a 2-core machine, so a
    # workers=0 step of 256 takes ~4 s and the card's 3-job sweep would overrun 3 minutes.
    # Per-sample costs do not depend on batch size; `loader=seed` restores 256.
    batch_size: int = 32
    pin_memory: bool = True
    prefetch_factor: int = 2
    persistent_workers: bool = False
    multiprocessing_context: Optional[str] = None
    shuffle: bool = True
    drop_last: bool = True
    # A worker silent this long is reported as hung; generous, as 8 workers share 2 cores.
    timeout_s: float = 120.0
    # How workers hand tensors to the main process: file_descriptor (torch's default on
    # Linux) or file_system. null keeps torch's default.
    sharing_strategy: Optional[str] = None
    # What makes the batches: dataloader (worker processes), threads (torchdata.nodes on threads)
    # or spdl (an SPDL pipeline on threads); `workers` counts processes or threads as it says.
    backend: str = "dataloader"

    PREFIX: ClassVar = "loader."
    # timeout_s 0 would let a hung worker hang the sweep: DataLoader reads it as "wait forever".
    RANGES: ClassVar = {"batch_size": (1, MAX_BATCH_SIZE), "prefetch_factor": (1, MAX_PREFETCH_FACTOR),
                        "timeout_s": (0, MAX_TIMEOUT_S, True)}
    CHOICES: ClassVar = {"multiprocessing_context": (*START_METHODS, None),
                         "sharing_strategy": (*SHARING_STRATEGIES, None), "backend": LOADER_BACKENDS}


@dataclass(frozen=True)
class RunSpec(Checked):
    """How long to measure: warm-up, then at least `steps` steps and `min_time_s` seconds, `repeats` times."""

    # With workers, warm-up also drains the workers x prefetch_factor batches queued at start-up.
    warmup_steps: int = 3
    steps: int = 20
    # The window is at least this many whole worker cycles (W steps each): a starved loop gets W
    # batches, then waits a whole cycle, so its rate is periodic in W. Eight whole cycles keep the
    # batch-means interval honest (its blocks are cycles; fewer read too narrow) and
    # cost ~20 s at 16 workers, batch 256 on an H100 host.
    worker_cycles: int = 8
    min_time_s: float = 5.0
    # A budget that caps the window when whole cycles take too long; the row says it was capped.
    max_time_s: float = 120.0
    repeats: int = 1
    # Which interleaved round this job belongs to; the CLI sweeps it when `rounds` > 1.
    round: int = 0
    seed: int = 0
    # Extra steps under torch.profiler when workers=0, after the measured ones, so the
    # profiler's own overhead never lands in the measured numbers.
    profile_steps: int = 2
    # fail: stop at the first bad sample, naming it. skip: drop it, count it, go on.
    on_error: str = "fail"
    progress: bool = True
    # continue: a job that fails is listed when the sweep ends and the next job runs; stop: the
    # sweep stops at the first failed job. Either way finished rows are kept and the sweep exits
    # non-zero (pipebench's own launcher; a cluster launcher runs every job regardless).
    on_job_error: str = "continue"
    # The longest one step's own work in the main process may take: making the batch at
    # workers=0 (load, transforms, collate), and the consumer step at any worker count. A step
    # past it is interrupted and the job ends naming the transform and sample it was on. Waiting
    # for workers is loader.timeout_s's to bound, so this is apart from it. As generous as
    # loader.timeout_s: the seed chain at batch 256 takes ~4 s a step at workers=0 here.
    step_timeout_s: float = 120.0
    # The step loop: auto runs ahead (async) wherever the consumer trains on CUDA, as training
    # does; per_step synchronises every phase so each is timed on its own (pipebench.measure.repeats).
    sync: str = "auto"
    # The accel_util_pct the diagnosis sizes workers and cores for, and `explore --target` stops at:
    # 90%, the usual "keep the GPU busy" bar (DLIO gates its runs on such a target).
    target_accel_util_pct: float = 90.0
    # Stop the sweep at the first job whose accel_util_pct reaches the target (`explore --target`).
    stop_at_target: bool = False
    # Each step's thread-scaling profile after the measured repeats (pipebench.measure.thread_profile):
    # null profiles under a backend whose workers are threads, true under any, false never.
    thread_profile: Optional[bool] = None

    PREFIX: ClassVar = "run."
    RANGES: ClassVar = {"warmup_steps": (0, MAX_STEPS), "steps": (1, MAX_STEPS), "worker_cycles": (1, MAX_STEPS),
                        "min_time_s": (0, MAX_TIMEOUT_S), "max_time_s": (0, MAX_TIMEOUT_S, True),
                        "repeats": (1, MAX_REPEATS), "round": (0, MAX_REPEATS), "seed": (0, MAX_SEED),
                        "profile_steps": (0, MAX_PROFILE_STEPS), "step_timeout_s": (0, MAX_TIMEOUT_S, True),
                        "target_accel_util_pct": (0, 100, True)}
    CHOICES: ClassVar = {"on_error": ON_ERROR_POLICIES, "on_job_error": ON_JOB_ERROR_POLICIES, "sync": SYNC_MODES}


@dataclass(frozen=True)
class ConsumerSpec(Checked):
    """What eats the batches: `none` (loader only), `emulated` (sleeps like an accelerator), `toy_cnn`."""

    kind: str = EMULATED
    # 30 ms: the seed article's GPU compute per step (18% of 1.3 s at batch 256, so ~0.9 ms a
    # sample) scaled to the default batch of 32. Scale it with loader.batch_size.
    step_ms: float = 30.0
    # emulated: fixed, normal (spread_ms = standard deviation) or uniform (± spread_ms).
    distribution: str = "fixed"
    spread_ms: float = 0.0
    # toy_cnn: the seed's SGD settings, and where to run (auto = CUDA when present).
    lr: float = 0.001
    momentum: float = 0.9
    device: str = "auto"

    PREFIX: ClassVar = "consumer."
    RANGES: ClassVar = {"step_ms": (0, MAX_STEP_MS), "spread_ms": (0, MAX_STEP_MS)}
    CHOICES: ClassVar = {"kind": CONSUMER_KINDS, "distribution": STEP_DISTRIBUTIONS, "device": CONSUMER_DEVICES}

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(math.isfinite(self.lr) and self.lr > 0, f"consumer.lr must be a finite number > 0, got {self.lr}")
        _require(math.isfinite(self.momentum), f"consumer.momentum must be a finite number, got {self.momentum}")


@dataclass(frozen=True)
class DistributedSpec(Checked):
    """Multi-rank loading: `nproc` ranks started by torchrun on this node, each with its own
    DistributedSampler and DataLoader workers, meeting at an all-reduce after every step."""

    # 1: the ordinary single-process job. More: torchrun --standalone --nproc_per_node=nproc.
    nproc: int = 1
    # auto: nccl when every rank can have its own GPU, else gloo (the CPU backend).
    backend: str = "auto"
    # A rank that waits this long at the all-reduce fails (a peer hung or died): the process
    # group's timeout. Generous: ranks x workers may far outnumber cores while measuring.
    collective_timeout_s: float = 300.0
    # The whole multi-rank run is stopped after this long, whatever the ranks are doing.
    job_timeout_s: float = 3600.0

    PREFIX: ClassVar = "distributed."
    RANGES: ClassVar = {"nproc": (1, MAX_RANKS), "collective_timeout_s": (0, MAX_TIMEOUT_S, True),
                        "job_timeout_s": (0, MAX_TIMEOUT_S, True)}
    CHOICES: ClassVar = {"backend": DISTRIBUTED_BACKENDS}


@dataclass(frozen=True)
class StorageSpec:
    """How a file-backed dataset's files are read: the cache mode, and an emulated storage
    (`latency_ms` + bytes / `mb_per_s` slept on every file read; 0 and None: no emulation), and
    `shared_mb_per_s`, one bandwidth every worker and rank of the host draws from
    (pipebench.storage.shared_link), through the link file at `link` (set where the job starts)."""

    cache: str = "warm"
    latency_ms: float = 0.0
    mb_per_s: Optional[float] = None
    shared_mb_per_s: Optional[float] = None
    link: Optional[str] = None

    @property
    def emulated(self) -> bool:
        return self.latency_ms > 0 or self.mb_per_s is not None or self.shared_mb_per_s is not None


@dataclass(frozen=True, kw_only=True)
class TransformChains:
    """Lists of Hydra `_target_` nodes: applied per sample in the Dataset, per batch in the collate,
    and per batch after the host-to-device copy (`on_device`: in the main process, on the consumer's
    device, or on the host CPU when the consumer has none). The config's `transform` node; a job's
    spec holds them as its own fields, each frozen as a tuple."""

    per_sample: Tuple[Any, ...] = ()
    per_batch: Tuple[Any, ...] = ()
    on_device: Tuple[Any, ...] = ()


@dataclass(frozen=True, kw_only=True)
class JobSettings(Checked):
    """The keys a user sets for one job. The composed config (pipebench.config.schema.PipebenchConfig)
    adds the `transform` node and `results_dir`; the job's spec adds what composing derives."""

    # A `_target_` node, so users can plug their own; a dataset group's config gives it.
    dataset: Any
    loader: LoaderSpec = field(default_factory=LoaderSpec)
    run: RunSpec = field(default_factory=RunSpec)
    consumer: ConsumerSpec = field(default_factory=ConsumerSpec)
    workers: int = 0
    # torch: a torch.profiler trace of a few extra steps at workers=0; viztracer: one
    # Perfetto trace of the main process and every worker; none: no trace.
    trace: str = "torch"
    # Run every job of the sweep this many times, round-robin (all jobs once, then all again),
    # so drift on a shared machine hits every job alike. Each round is a fresh job process.
    rounds: int = 1
    # Time a fixed decode + transform micro-benchmark once per invocation (calibration.json),
    # so a machine that got slower overall is told apart from a slower pipeline, and run the same
    # workload now and then inside each job's workers (the CPU reference, about 2% of their CPU),
    # so a busier host is told apart from a dearer chain. Off by default: it costs a few seconds
    # per `pipebench run`; suite=nightly turns it on.
    calibrate: bool = False
    distributed: DistributedSpec = field(default_factory=DistributedSpec)

    RANGES: ClassVar = {"workers": (0, MAX_WORKERS), "rounds": (1, MAX_REPEATS)}
    CHOICES: ClassVar = {"trace": TRACE_KINDS}

    def __post_init__(self) -> None:
        super().__post_init__()
        # The VizTracer timeline starts one recorder a worker process (its worker_init_fn); a thread
        # pool has no such hook, and one recorder shared by threads would interleave their slices.
        _require(self.trace != "viztracer" or self.loader.backend == "dataloader" or self.workers == 0,
                 f"trace=viztracer traces worker processes; loader.backend={self.loader.backend} runs threads "
                 "(use trace=none, or loader.backend=dataloader)")
        # The watchdog would stop every step of an emulated consumer asked to sleep this long.
        consumer, step_timeout_s = self.consumer, self.run.step_timeout_s
        _require(consumer.kind != EMULATED or consumer.step_ms + consumer.spread_ms < step_timeout_s * 1000,
                 f"consumer.step_ms + consumer.spread_ms must stay below run.step_timeout_s, got "
                 f"{consumer.step_ms + consumer.spread_ms:g} ms against {step_timeout_s:g} s")


@dataclass(frozen=True, kw_only=True)
class JobSpec(JobSettings, TransformChains):
    """Everything one job needs: its settings, each chain a tuple, Hydra's group choices as row
    labels and the storage. `dataset` and the chains stay `_target_` dicts until built."""

    dataset_name: str
    transform_name: str
    storage: StorageSpec = StorageSpec()

    @property
    def worker_kind(self) -> str:
        """What the job's workers are: THREADS under a thread backend with workers, else PROCESSES
        (workers=0 is the DataLoader's in-process loop under every backend)."""
        return BACKEND_WORKER_KINDS[self.loader.backend] if self.workers > 0 else PROCESSES


def _check_target_nodes(nodes: Any, where: str) -> Tuple[Mapping[str, Any], ...]:
    _require(isinstance(nodes, list), f"{where} must be a list of `_target_` nodes")
    for i, node in enumerate(nodes):
        _require(
            isinstance(node, dict) and isinstance(TargetNode.of(node).target, str),
            f"{where}[{i}] must be a mapping with a `_target_` (got {node!r})",
        )
    return tuple(nodes)


def _storage_spec(dataset: dict) -> StorageSpec:
    """Take `cache` and `storage` off the dataset node and check them (errors name `dataset.*`): pipebench
    applies them to the built dataset, so no dataset class has to accept them as arguments."""
    cache = dataset.pop("cache", "warm")
    storage = dataset.pop("storage", None) or {}
    _one_of("dataset.cache", cache, CACHE_MODES)
    _require(isinstance(storage, dict), f"dataset.storage must be a mapping of {', '.join(STORAGE_EMULATION_KEYS)}")
    for key in storage:
        _require(key in STORAGE_EMULATION_KEYS,
                 f"dataset.storage.{key} is not a key; known: {', '.join(STORAGE_EMULATION_KEYS)}")
    given = StorageSpec(cache=cache, **storage)  # its keys checked above: each a field
    numbers = {}
    for key, minimum, maximum in (("latency_ms", 0, MAX_STORAGE_LATENCY_MS),
                                  ("mb_per_s", MIN_STORAGE_MB_PER_S, MAX_STORAGE_MB_PER_S),
                                  ("shared_mb_per_s", MIN_STORAGE_MB_PER_S, MAX_STORAGE_MB_PER_S)):
        value = getattr(given, key)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        _require(number or (key != "latency_ms" and value is None),
                 f"dataset.storage.{key} must be a number, got {value!r}")
        if value is not None:
            bounded(f"dataset.storage.{key}", value, minimum, maximum)
        numbers[key] = None if value is None else float(value)
    return StorageSpec(cache=cache, **numbers)


def _to_plain(cfg: DictConfig) -> dict:
    """Every key but `hydra` (whose job fields exist only once a job is launched), resolved, each
    structured node built into its frozen spec, whose checks name the key (a dataset stays a dict,
    which keeps any key a user added to it)."""
    plain = {}
    for key in cfg:
        if key == "hydra":
            continue
        try:
            node = cfg[key]
            group = OmegaConf.get_type(node) if key == "dataset" and OmegaConf.is_config(node) else None
            if is_dataclass(group):  # a catalogue group's node: checked, then built from its `_target_` dict
                plain[key] = OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
                group(**{f.name: plain[key][f.name] for f in fields(group)})
            else:
                plain[key] = OmegaConf.to_object(node) if OmegaConf.is_config(node) else node
        except OmegaConfBaseException as exc:
            where = getattr(exc, "full_key", None) or key
            raise ConfigError(f"{where}: {str(exc).splitlines()[0]}") from exc
    return plain


def job_spec_from_config(cfg: DictConfig, choices: Mapping[str, Optional[str]]) -> JobSpec:
    """Resolve and check a composed config (a ConfigError names the offending key); `choices`, Hydra's
    runtime group choices (`transform` -> `yuv_mask`), label the rows."""
    plain = _to_plain(cfg)
    dataset = plain["dataset"]
    _require(isinstance(dataset, dict) and "_target_" in dataset, "dataset must be a mapping with a `_target_`")
    storage = _storage_spec(dataset)
    chains = {f.name: _check_target_nodes(getattr(plain["transform"], f.name), f"transform.{f.name}")
              for f in fields(TransformChains)}
    return JobSpec(**{f.name: plain[f.name] for f in fields(JobSettings)}, **chains, storage=storage,
                   dataset_name=str(choices.get("dataset") or "custom"),
                   transform_name=str(choices.get("transform") or "custom"))
