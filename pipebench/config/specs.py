"""Frozen, plain-Python job specs built from a composed config, with every value checked.

Configs are resolved to plain Python here, before anything reaches a Dataset or a worker:
DictConfig access in a hot loop is slow, and plain values pickle cheaply under spawn.
"""

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipebench.base.errors import ConfigError

# The start methods torch.multiprocessing accepts for DataLoader workers.
START_METHODS = ("fork", "spawn", "forkserver")
ON_ERROR_POLICIES = ("fail", "skip")
CONSUMER_KINDS = ("none", "emulated", "toy_cnn", "masked_loss_sync", "masked_loss_fixed")
STEP_DISTRIBUTIONS = ("fixed", "normal", "uniform")
CONSUMER_DEVICES = ("auto", "cpu", "cuda")
SHARING_STRATEGIES = ("file_descriptor", "file_system")
TRACE_KINDS = ("none", "torch", "viztracer")
DISTRIBUTED_BACKENDS = ("auto", "gloo", "nccl")


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
class JobSpec:
    """Everything one job needs. `dataset` and the chains stay `_target_` dicts until built."""

    dataset: Mapping[str, Any]
    per_sample: Tuple[Mapping[str, Any], ...]
    per_batch: Tuple[Mapping[str, Any], ...]
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


def _validate_loader(loader: LoaderSpec) -> None:
    _require(loader.batch_size >= 1, f"loader.batch_size must be >= 1, got {loader.batch_size}")
    _require(
        loader.prefetch_factor >= 1, f"loader.prefetch_factor must be >= 1, got {loader.prefetch_factor}"
    )
    _require(loader.timeout_s >= 0, f"loader.timeout_s must be >= 0, got {loader.timeout_s}")
    _require(
        loader.multiprocessing_context in (None, *START_METHODS),
        f"loader.multiprocessing_context must be one of {', '.join(START_METHODS)} or null, "
        f"got {loader.multiprocessing_context!r}",
    )
    _require(
        loader.sharing_strategy in (None, *SHARING_STRATEGIES),
        f"loader.sharing_strategy must be one of {', '.join(SHARING_STRATEGIES)} or null, "
        f"got {loader.sharing_strategy!r}",
    )


def _validate_run(run: RunSpec) -> None:
    _require(run.warmup_steps >= 0, f"run.warmup_steps must be >= 0, got {run.warmup_steps}")
    _require(run.steps >= 1, f"run.steps must be >= 1, got {run.steps}")
    _require(run.worker_cycles >= 1, f"run.worker_cycles must be >= 1, got {run.worker_cycles}")
    _require(run.min_time_s >= 0, f"run.min_time_s must be >= 0, got {run.min_time_s}")
    _require(run.max_time_s > 0, f"run.max_time_s must be > 0, got {run.max_time_s}")
    _require(run.repeats >= 1, f"run.repeats must be >= 1, got {run.repeats}")
    _require(run.round >= 0, f"run.round must be >= 0, got {run.round}")
    _require(run.profile_steps >= 0, f"run.profile_steps must be >= 0, got {run.profile_steps}")
    _require(
        run.on_error in ON_ERROR_POLICIES,
        f"run.on_error must be one of {', '.join(ON_ERROR_POLICIES)}, got {run.on_error!r}",
    )


def _validate_consumer(consumer: ConsumerSpec) -> None:
    _require(
        consumer.kind in CONSUMER_KINDS,
        f"consumer.kind must be one of {', '.join(CONSUMER_KINDS)}, got {consumer.kind!r}",
    )
    _require(consumer.step_ms >= 0, f"consumer.step_ms must be >= 0, got {consumer.step_ms}")
    _require(consumer.spread_ms >= 0, f"consumer.spread_ms must be >= 0, got {consumer.spread_ms}")
    _require(
        consumer.distribution in STEP_DISTRIBUTIONS,
        f"consumer.distribution must be one of {', '.join(STEP_DISTRIBUTIONS)}, got {consumer.distribution!r}",
    )
    _require(
        consumer.device in CONSUMER_DEVICES,
        f"consumer.device must be one of {', '.join(CONSUMER_DEVICES)}, got {consumer.device!r}",
    )
    _require(consumer.lr > 0, f"consumer.lr must be > 0, got {consumer.lr}")


def _validate_distributed(distributed: DistributedSpec) -> None:
    _require(distributed.nproc >= 1, f"distributed.nproc must be >= 1, got {distributed.nproc}")
    _require(
        distributed.backend in DISTRIBUTED_BACKENDS,
        f"distributed.backend must be one of {', '.join(DISTRIBUTED_BACKENDS)}, got {distributed.backend!r}",
    )
    _require(distributed.collective_timeout_s > 0,
             f"distributed.collective_timeout_s must be > 0, got {distributed.collective_timeout_s}")
    _require(distributed.job_timeout_s > 0, f"distributed.job_timeout_s must be > 0, got {distributed.job_timeout_s}")


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
    _require(plain["workers"] >= 0, f"workers must be >= 0, got {plain['workers']}")
    _require(plain["rounds"] >= 1, f"rounds must be >= 1, got {plain['rounds']}")
    _require(plain["trace"] in TRACE_KINDS,
             f"trace must be one of {', '.join(TRACE_KINDS)}, got {plain['trace']!r}")
    _require(
        isinstance(plain["dataset"], dict) and "_target_" in plain["dataset"],
        "dataset must be a mapping with a `_target_`",
    )
    loader = LoaderSpec(**plain["loader"])
    run = RunSpec(**plain["run"])
    consumer = ConsumerSpec(**plain["consumer"])
    _validate_loader(loader)
    _validate_run(run)
    _validate_consumer(consumer)
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
    )
