"""Frozen, plain-Python job specs built from a composed config, with every value checked.

Configs are resolved to plain Python here, before anything reaches a Dataset or a worker:
DictConfig access in a hot loop is slow, and plain values pickle cheaply under spawn.
A spec field named like a schema key (pipebench.config.schema) has its type and no default: the
schema's is the one default, and Hydra applies it. tests/test_config.py fails where the two differ.
"""

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple, Union

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

# The start methods torch.multiprocessing accepts for DataLoader workers.
START_METHODS = ("fork", "spawn", "forkserver")
ON_ERROR_POLICIES = ("fail", "skip")
ON_JOB_ERROR_POLICIES = ("continue", "stop")
# The masked-loss pair (pipebench.pipeline.masked_loss): the version with syncs, then without.
MASKED_LOSS_KINDS = ("masked_loss_sync", "masked_loss_fixed")
# consumer=none: the loader alone, nothing eats the batches (the diagnosis then sizes no consumer).
NO_CONSUMER = "none"
CONSUMER_KINDS = (NO_CONSUMER, "emulated", "toy_cnn", *MASKED_LOSS_KINDS)
# What stands in a watched loader's consumer column (pipebench attach / watch): the step is the
# user's own code, not one of CONSUMER_KINDS. Here, not beside the watch, so readers need no torch.
USER_STEP = "user_step"
STEP_DISTRIBUTIONS = ("fixed", "normal", "uniform")
CONSUMER_DEVICES = ("auto", "cpu", "cuda")
SHARING_STRATEGIES = ("file_descriptor", "file_system")
# loader.backend: what makes the batches (pipebench.pipeline.loader_backends). dataloader: torch's
# DataLoader and its worker processes; threads: torchdata.nodes on a thread pool; spdl: an SPDL
# pipeline on a thread pool. Named here, below the pipeline, so a typo is one line at compose time.
# What `workers=` counts under each backend: worker processes, or threads of the job's own
# process. Here too, so the meters and the report (which imports no torch) tell the two apart.
PROCESSES, THREADS = "processes", "threads"
BACKEND_WORKER_KINDS = {"dataloader": PROCESSES, "threads": THREADS, "spdl": THREADS}
LOADER_BACKENDS = tuple(BACKEND_WORKER_KINDS)
TRACE_KINDS = ("none", "torch", "viztracer")
DISTRIBUTED_BACKENDS = ("auto", "gloo", "nccl")
# warm: the files are read once before measuring, so the page cache serves the run; cold: each
# file's pages are dropped before it is read, so every read goes to storage (a set larger than RAM).
CACHE_MODES = ("warm", "cold")
STORAGE_EMULATION_KEYS = ("latency_ms", "mb_per_s", "shared_mb_per_s")
# run.sync: the step loop (pipebench.measure.repeats).
SYNC_AUTO, SYNC_ASYNC, SYNC_PER_STEP = "auto", "async", "per_step"
SYNC_MODES = (SYNC_AUTO, SYNC_ASYNC, SYNC_PER_STEP)


@dataclass(frozen=True)
class LoaderSpec:
    batch_size: int
    pin_memory: bool
    prefetch_factor: int
    persistent_workers: bool
    multiprocessing_context: Optional[str]
    shuffle: bool
    drop_last: bool
    timeout_s: float
    sharing_strategy: Optional[str]
    backend: str


@dataclass(frozen=True)
class RunSpec:
    warmup_steps: int
    steps: int
    worker_cycles: int
    min_time_s: float
    max_time_s: float
    repeats: int
    round: int
    seed: int
    profile_steps: int
    on_error: str
    progress: bool
    on_job_error: str
    step_timeout_s: float
    sync: str
    target_accel_util_pct: float
    stop_at_target: bool
    # None: profile under a thread backend (pipebench.measure.thread_profile.profile_wanted).
    thread_profile: Optional[bool]


@dataclass(frozen=True)
class ConsumerSpec:
    kind: str
    step_ms: float
    distribution: str
    spread_ms: float
    lr: float
    momentum: float
    device: str


@dataclass(frozen=True)
class DistributedSpec:
    nproc: int
    backend: str
    collective_timeout_s: float
    job_timeout_s: float


@dataclass(frozen=True)
class StorageSpec:
    """How a file-backed dataset's files are read: the cache mode, and an emulated storage
    (`latency_ms` + bytes / `mb_per_s` slept on every file read; 0 and None: no emulation), and
    `shared_mb_per_s`, one bandwidth every worker and rank of the host draws from
    (pipebench.pipeline.shared_link), through the link file at `link` (set where the job starts)."""

    cache: str = "warm"
    latency_ms: float = 0.0
    mb_per_s: Optional[float] = None
    shared_mb_per_s: Optional[float] = None
    link: Optional[str] = None

    @property
    def emulated(self) -> bool:
        return self.latency_ms > 0 or self.mb_per_s is not None or self.shared_mb_per_s is not None


@dataclass(frozen=True)
class JobSpec:
    """Everything one job needs. `dataset` and the chains stay `_target_` dicts until built."""

    dataset: Mapping[str, Any]
    per_sample: Tuple[Mapping[str, Any], ...]
    per_batch: Tuple[Mapping[str, Any], ...]
    # Steps run on the batch after the host-to-device copy (transform.on_device).
    on_device: Tuple[Mapping[str, Any], ...]
    loader: LoaderSpec
    run: RunSpec
    consumer: ConsumerSpec
    workers: int
    trace: str
    rounds: int
    calibrate: bool
    dataset_name: str
    transform_name: str
    distributed: DistributedSpec
    storage: StorageSpec = StorageSpec()

    @property
    def worker_kind(self) -> str:
        """What the job's workers are: THREADS under a thread backend with workers, else PROCESSES
        (workers=0 is the DataLoader's in-process loop under every backend)."""
        return BACKEND_WORKER_KINDS[self.loader.backend] if self.workers > 0 else PROCESSES


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_target_nodes(nodes: Any, where: str) -> Tuple[Mapping[str, Any], ...]:
    _require(isinstance(nodes, list), f"{where} must be a list of `_target_` nodes")
    for i, node in enumerate(nodes):
        _require(
            isinstance(node, dict) and isinstance(node.get("_target_"), str),
            f"{where}[{i}] must be a mapping with a `_target_` (got {node!r})",
        )
    return tuple(nodes)


def _bounded(key: str, value: Union[int, float], minimum: float, maximum: float, above: bool = False) -> None:
    """`key` is a finite number from `minimum` (excluded when `above`) to `maximum` (pipebench.config.limits)."""
    _require(not (isinstance(value, float) and not math.isfinite(value)), f"{key} must be a finite number, got {value}")
    low_ok = value > minimum if above else value >= minimum
    _require(low_ok and value <= maximum,
             f"{key} must be {'>' if above else '>='} {minimum:g} and <= {maximum:g}, got {value!r}")


def _one_of(key: str, value: Any, allowed: Tuple[Optional[str], ...]) -> None:
    named = ", ".join(a for a in allowed if a is not None) + (" or null" if None in allowed else "")
    _require(value in allowed, f"{key} must be one of {named}, got {value!r}")


def _validate_loader(loader: LoaderSpec) -> None:
    _bounded("loader.batch_size", loader.batch_size, 1, MAX_BATCH_SIZE)
    _bounded("loader.prefetch_factor", loader.prefetch_factor, 1, MAX_PREFETCH_FACTOR)
    # 0 would let a hung worker hang the sweep: DataLoader reads it as "wait forever".
    _bounded("loader.timeout_s", loader.timeout_s, 0, MAX_TIMEOUT_S, above=True)
    _one_of("loader.multiprocessing_context", loader.multiprocessing_context, (*START_METHODS, None))
    _one_of("loader.sharing_strategy", loader.sharing_strategy, (*SHARING_STRATEGIES, None))
    _one_of("loader.backend", loader.backend, LOADER_BACKENDS)


def _validate_run(run: RunSpec) -> None:
    _bounded("run.warmup_steps", run.warmup_steps, 0, MAX_STEPS)
    _bounded("run.steps", run.steps, 1, MAX_STEPS)
    _bounded("run.worker_cycles", run.worker_cycles, 1, MAX_STEPS)
    _bounded("run.min_time_s", run.min_time_s, 0, MAX_TIMEOUT_S)
    _bounded("run.max_time_s", run.max_time_s, 0, MAX_TIMEOUT_S, above=True)
    _bounded("run.repeats", run.repeats, 1, MAX_REPEATS)
    _bounded("run.round", run.round, 0, MAX_REPEATS)
    _bounded("run.seed", run.seed, 0, MAX_SEED)
    _bounded("run.profile_steps", run.profile_steps, 0, MAX_PROFILE_STEPS)
    _bounded("run.step_timeout_s", run.step_timeout_s, 0, MAX_TIMEOUT_S, above=True)
    _one_of("run.on_error", run.on_error, ON_ERROR_POLICIES)
    _one_of("run.on_job_error", run.on_job_error, ON_JOB_ERROR_POLICIES)
    _one_of("run.sync", run.sync, SYNC_MODES)
    _bounded("run.target_accel_util_pct", run.target_accel_util_pct, 0, 100, above=True)


def _validate_consumer(consumer: ConsumerSpec, step_timeout_s: float) -> None:
    _one_of("consumer.kind", consumer.kind, CONSUMER_KINDS)
    _bounded("consumer.step_ms", consumer.step_ms, 0, MAX_STEP_MS)
    _bounded("consumer.spread_ms", consumer.spread_ms, 0, MAX_STEP_MS)
    # The watchdog would stop every step of an emulated consumer asked to sleep this long.
    _require(consumer.kind != "emulated" or consumer.step_ms + consumer.spread_ms < step_timeout_s * 1000,
             f"consumer.step_ms + consumer.spread_ms must stay below run.step_timeout_s, got "
             f"{consumer.step_ms + consumer.spread_ms:g} ms against {step_timeout_s:g} s")
    _one_of("consumer.distribution", consumer.distribution, STEP_DISTRIBUTIONS)
    _one_of("consumer.device", consumer.device, CONSUMER_DEVICES)
    _require(math.isfinite(consumer.lr) and consumer.lr > 0, f"consumer.lr must be a finite number > 0, got {consumer.lr}")
    _require(math.isfinite(consumer.momentum), f"consumer.momentum must be a finite number, got {consumer.momentum}")


def _validate_distributed(distributed: DistributedSpec) -> None:
    _bounded("distributed.nproc", distributed.nproc, 1, MAX_RANKS)
    _one_of("distributed.backend", distributed.backend, DISTRIBUTED_BACKENDS)
    _bounded("distributed.collective_timeout_s", distributed.collective_timeout_s, 0, MAX_TIMEOUT_S, above=True)
    _bounded("distributed.job_timeout_s", distributed.job_timeout_s, 0, MAX_TIMEOUT_S, above=True)


def _storage_spec(dataset: dict) -> StorageSpec:
    """Take `cache` and `storage` off the dataset node and check them (errors name `dataset.*`).

    pipebench applies them to the built dataset (pipebench.measure.storage_cache), so no dataset
    class has to accept them as arguments.
    """
    cache = dataset.pop("cache", "warm")
    storage = dataset.pop("storage", None) or {}
    _one_of("dataset.cache", cache, CACHE_MODES)
    _require(isinstance(storage, dict), f"dataset.storage must be a mapping of {', '.join(STORAGE_EMULATION_KEYS)}")
    for key in storage:
        _require(key in STORAGE_EMULATION_KEYS,
                 f"dataset.storage.{key} is not a key; known: {', '.join(STORAGE_EMULATION_KEYS)}")
    latency_ms = storage.get("latency_ms", 0.0)
    mb_per_s = storage.get("mb_per_s")  # None: no bandwidth limit
    shared = storage.get("shared_mb_per_s")  # None: no host-wide bandwidth
    for key, value, may_be_none in (("latency_ms", latency_ms, False), ("mb_per_s", mb_per_s, True),
                                    ("shared_mb_per_s", shared, True)):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        _require(number or (may_be_none and value is None), f"dataset.storage.{key} must be a number, got {value!r}")
    _bounded("dataset.storage.latency_ms", latency_ms, 0, MAX_STORAGE_LATENCY_MS)
    for key, value in (("mb_per_s", mb_per_s), ("shared_mb_per_s", shared)):
        if value is not None:
            _bounded(f"dataset.storage.{key}", value, MIN_STORAGE_MB_PER_S, MAX_STORAGE_MB_PER_S)
    return StorageSpec(cache=cache, latency_ms=float(latency_ms),
                       mb_per_s=None if mb_per_s is None else float(mb_per_s),
                       shared_mb_per_s=None if shared is None else float(shared))


def _to_plain(cfg: DictConfig) -> dict:
    """Resolve every key but `hydra` (whose job fields exist only once a job is launched)."""
    plain = {}
    for key in cfg:
        if key == "hydra":
            continue
        try:
            node = cfg[key]
            plain[key] = OmegaConf.to_container(node, resolve=True, throw_on_missing=True) \
                if OmegaConf.is_config(node) else node
        except OmegaConfBaseException as exc:
            where = getattr(exc, "full_key", None) or key
            raise ConfigError(f"{where}: {str(exc).splitlines()[0]}") from exc
    return plain


def job_spec_from_config(cfg: DictConfig, choices: Mapping[str, Optional[str]]) -> JobSpec:
    """Resolve and check a composed config. Raises ConfigError naming the offending key.

    `choices` are Hydra's runtime group choices (`transform` -> `yuv_mask`), used as row labels.
    """
    plain = _to_plain(cfg)
    _bounded("workers", plain["workers"], 0, MAX_WORKERS)
    _bounded("rounds", plain["rounds"], 1, MAX_REPEATS)
    _one_of("trace", plain["trace"], TRACE_KINDS)
    _require(
        isinstance(plain["dataset"], dict) and "_target_" in plain["dataset"],
        "dataset must be a mapping with a `_target_`",
    )
    storage = _storage_spec(plain["dataset"])
    loader = LoaderSpec(**plain["loader"])
    run = RunSpec(**plain["run"])
    consumer = ConsumerSpec(**plain["consumer"])
    _validate_loader(loader)
    # The VizTracer timeline starts one recorder a worker process (its worker_init_fn); a thread
    # pool has no such hook, and one recorder shared by threads would interleave their slices.
    _require(plain["trace"] != "viztracer" or loader.backend == "dataloader" or plain["workers"] == 0,
             f"trace=viztracer traces worker processes; loader.backend={loader.backend} runs threads "
             "(use trace=none, or loader.backend=dataloader)")
    _validate_run(run)
    _validate_consumer(consumer, run.step_timeout_s)
    distributed = DistributedSpec(**plain["distributed"])
    _validate_distributed(distributed)
    return JobSpec(
        dataset=plain["dataset"],
        per_sample=_check_target_nodes(plain["transform"]["per_sample"], "transform.per_sample"),
        per_batch=_check_target_nodes(plain["transform"]["per_batch"], "transform.per_batch"),
        loader=loader,
        run=run,
        consumer=consumer,
        workers=plain["workers"],
        trace=plain["trace"],
        rounds=plain["rounds"],
        calibrate=plain["calibrate"],
        dataset_name=str(choices.get("dataset") or "custom"),
        transform_name=str(choices.get("transform") or "custom"),
        distributed=distributed,
        storage=storage,
        on_device=_check_target_nodes(plain["transform"].get("on_device", []), "transform.on_device"),
    )
