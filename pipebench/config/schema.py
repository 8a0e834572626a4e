"""Structured configs: the typed schema Hydra validates every composed config against.

Each key is a field of the job's frozen spec too (pipebench.config.specs), declared there with the
same name and type and no default; tests/test_config.py fails where the two differ.
"""

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

# Where runs write their folders unless `results_dir=` says otherwise.
DEFAULT_RESULTS_DIR = "results"


@dataclass
class TransformChainConfig:
    """Lists of Hydra `_target_` nodes: applied per sample in the Dataset, per batch in the collate,
    and per batch after the host-to-device copy (`on_device`: in the main process, on the consumer's
    device, or on the host CPU when the consumer has none)."""

    per_sample: List[Any] = field(default_factory=list)
    per_batch: List[Any] = field(default_factory=list)
    on_device: List[Any] = field(default_factory=list)


@dataclass
class LoaderConfig:
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


@dataclass
class RunConfig:
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


@dataclass
class ConsumerConfig:
    """What eats the batches: `none` (loader only), `emulated` (sleeps like an accelerator), `toy_cnn`."""

    kind: str = "emulated"
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


@dataclass
class DistributedConfig:
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


@dataclass
class PipebenchConfig:
    """The whole job. `dataset` and each chain entry are `_target_` nodes, so users can plug their own."""

    dataset: Any = MISSING
    transform: TransformChainConfig = field(default_factory=TransformChainConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    run: RunConfig = field(default_factory=RunConfig)
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    workers: int = 0
    # torch: a torch.profiler trace of a few extra steps at workers=0; viztracer: one
    # Perfetto trace of the main process and every worker; none: no trace.
    trace: str = "torch"
    results_dir: str = DEFAULT_RESULTS_DIR
    # Run every job of the sweep this many times, round-robin (all jobs once, then all again),
    # so drift on a shared machine hits every job alike. Each round is a fresh job process.
    rounds: int = 1
    # Time a fixed decode + transform micro-benchmark once per invocation (calibration.json),
    # so a machine that got slower overall is told apart from a slower pipeline, and run the same
    # workload now and then inside each job's workers (the CPU reference, about 2% of their CPU),
    # so a busier host is told apart from a dearer chain. Off by default: it costs a few seconds
    # per `pipebench run`; suite=nightly turns it on.
    calibrate: bool = False
    distributed: DistributedConfig = field(default_factory=DistributedConfig)


@dataclass
class SubprocessLauncherConf:
    """hydra/launcher=pipebench_subprocess (hydra_plugins.pipebench_launcher): each job a fresh process."""

    _target_: str = "hydra_plugins.pipebench_launcher.subprocess_launcher.SubprocessLauncher"
    # Interpreter for job processes; null means the one running pipebench.
    python: Optional[str] = None
    # [pid, stdin, status] of the job process `pipebench run` or `explore` started ahead of its first job
    # (pipebench.measure.job_spawn); set by the command itself, never by a user.
    ahead: Optional[List[int]] = None


def register_launcher_config(store: ConfigStore) -> None:
    """The launcher's config node. Stored here too, not only by the plugin's import: Hydra finds the
    plugin by scanning hydra_plugins.__path__, which setuptools' editable finder does not extend,
    and `config.yaml` names this launcher, so composing without it fails under `pip install -e`."""
    store.store(group="hydra/launcher", name="pipebench_subprocess", node=SubprocessLauncherConf,
                provider="pipebench")


def register_schema(store: ConfigStore) -> None:
    """Put the schema and the launcher's node in Hydra's ConfigStore; `config.yaml` lists the schema
    first in its defaults."""
    store.store(name="pipebench_schema", node=PipebenchConfig)
    register_launcher_config(store)
