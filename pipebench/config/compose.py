"""Compose pipebench configs with Hydra's compose API, for checks and tools outside a Hydra job."""

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, Tuple

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from pipebench.base.errors import ConfigError
from pipebench.base.extras import install_line
from pipebench.config.schema import register_schema
from pipebench.config.specs import JobSpec, job_spec_from_config

CONFIG_MODULE = "pipebench.conf"
CONFIG_NAME = "config"
HYDRA_VERSION_BASE = "1.3"


# The submitit launchers come with an extra; a user who names one without it learns which.
SUBMITIT_EXTRA = "slurm"


def one_line(exc: BaseException) -> str:
    """Hydra and OmegaConf errors span many lines; users get the first line of each layer."""
    text = str(exc).split("Config search path")[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    message = lines[0].rstrip(".") if lines else type(exc).__name__
    options = [line for line in lines[1:] if not line.startswith("Available options")]
    if "Could not find" in message and options:
        message += "; available: " + ", ".join(options)
    if "Could not find 'hydra/launcher/submitit" in message:
        message += f"; the submitit launchers come with the {SUBMITIT_EXTRA} extra: {install_line([SUBMITIT_EXTRA])}"
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        message += ": " + str(cause).strip().splitlines()[0]
    return message


@dataclass(frozen=True)
class SweepSettings:
    """What a composed config says about the sweep as a whole, rather than about one job."""

    rounds: int
    # `hydra.sweeper.params` (e.g. from suite=nightly) as `key=value` overrides, in file order.
    params: Tuple[str, ...]


@contextmanager
def _composer() -> Iterator[Callable[[Sequence[str]], DictConfig]]:
    """Yields compose(overrides) -> the config with its `hydra` node; errors become ConfigError."""
    register_schema(ConfigStore.instance())
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=HYDRA_VERSION_BASE,
                                  job_name="pipebench"):
        def compose_cfg(overrides: Sequence[str]) -> DictConfig:
            try:
                return compose(CONFIG_NAME, overrides=list(overrides), return_hydra_config=True)
            except (HydraException, OmegaConfBaseException) as exc:
                raise ConfigError(one_line(exc)) from exc

        yield compose_cfg


@contextmanager
def job_spec_composer() -> Iterator[Callable[[Sequence[str]], Tuple[JobSpec, str]]]:
    """Yields compose(overrides) -> (JobSpec, results_dir); composition errors become ConfigError."""
    with _composer() as compose_cfg:
        def compose_one(overrides: Sequence[str]) -> Tuple[JobSpec, str]:
            cfg = compose_cfg(overrides)
            return job_spec_from_config(cfg, dict(cfg.hydra.runtime.choices)), str(cfg.results_dir)

        yield compose_one


def _resolved(node: object) -> object:
    """The config as plain values, each interpolation resolved where it can be; one that needs a
    running job (`${hydra.job.num}`, a missing `???`) stays as written."""
    if not isinstance(node, (DictConfig, ListConfig)):
        return node
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    written = OmegaConf.to_container(node, resolve=False)
    plain = {}
    for key in keys:
        try:
            plain[key] = _resolved(node[key])
        except OmegaConfBaseException:
            plain[key] = written[key]
    return plain if isinstance(node, DictConfig) else list(plain.values())


# What `--cfg` prints of a composed config, as Hydra's flag does: the job's keys, Hydra's node, or both.
CFG_PARTS = ("job", "hydra", "all")


@contextmanager
def config_printer(part: str, resolve: bool) -> Iterator[Callable[[Sequence[str]], str]]:
    """Yields text(overrides) -> the YAML `--cfg part [--resolve]` shows for one job. Resolved over
    the whole config, so the hydra node's interpolations of job keys (hydra.run.dir's
    `${results_dir}`) resolve, where Hydra's own `--cfg hydra --resolve` stops on them."""
    with _composer() as compose_cfg:
        def text(overrides: Sequence[str]) -> str:
            cfg = compose_cfg(overrides)
            if resolve:
                cfg = OmegaConf.create(_resolved(cfg))
            if part == "hydra":
                return OmegaConf.to_yaml({"hydra": cfg.hydra})
            if part == "job":
                with open_dict(cfg):
                    del cfg["hydra"]
            return OmegaConf.to_yaml(cfg)

        yield text


def sweep_settings(overrides: Sequence[str]) -> SweepSettings:
    """The rounds and sweeper params of the config one job's overrides compose to."""
    with _composer() as compose_cfg:
        cfg = compose_cfg(overrides)
    params = cfg.hydra.sweeper.params or {}
    return SweepSettings(rounds=int(cfg.rounds), params=tuple(f"{k}={v}" for k, v in params.items()))


def compose_job_spec(overrides: Sequence[str]) -> JobSpec:
    """The JobSpec for one set of overrides, as `pipebench run` would build it."""
    with job_spec_composer() as compose_one:
        return compose_one(overrides)[0]
