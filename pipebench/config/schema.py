"""Structured configs: the typed schema Hydra validates every composed config against.

Its nodes are the job's frozen specs (pipebench.config.specs), each key declared there once.
"""

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf

from pipebench.config.dataset_groups import DATASET_GROUPS, SCHEMA_GROUP
from pipebench.config.specs import JobSettings, TransformChains

# Where runs write their folders unless `results_dir=` says otherwise.
DEFAULT_RESULTS_DIR = "results"


@dataclass(frozen=True, kw_only=True)
class PipebenchConfig(JobSettings):
    """The whole job. `dataset` and each chain entry are `_target_` nodes, so users can plug their own."""

    transform: TransformChains = field(default_factory=TransformChains)
    results_dir: str = DEFAULT_RESULTS_DIR


def _writable(node: Any) -> Any:
    """`node` as a structured config whose keys overrides may set. OmegaConf marks the node of a
    frozen dataclass read-only; the specs are frozen once built, not while Hydra composes them."""
    OmegaConf.set_readonly(node, None)
    for key in node.keys() if isinstance(node, DictConfig) else range(len(node)):
        child = node._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)):
            _writable(child)
    return node


@dataclass
class SubprocessLauncherConf:
    """hydra/launcher=pipebench_subprocess (hydra_plugins.pipebench_launcher): each job a fresh process."""

    _target_: str = "hydra_plugins.pipebench_launcher.subprocess_launcher.SubprocessLauncher"
    # Interpreter for job processes; null means the one running pipebench.
    python: Optional[str] = None
    # [pid, stdin, status] of the job process `pipebench run` or `explore` started ahead of its first job
    # (pipebench.measure.job_spawn); set by the command itself, never by a user.
    ahead: Optional[List[int]] = None
    # The time (time.monotonic's clock) past which the launcher starts no job; set by tune's stages
    # (pipebench.sweep.launch.Into), never by a user.
    deadline: Optional[float] = None


def register_launcher_config(store: ConfigStore) -> None:
    """The launcher's config node. Stored here too, not only by the plugin's import: Hydra finds the
    plugin by scanning hydra_plugins.__path__, which setuptools' editable finder does not extend,
    and `config.yaml` names this launcher, so composing without it fails under `pip install -e`."""
    store.store(group="hydra/launcher", name="pipebench_subprocess", node=SubprocessLauncherConf,
                provider="pipebench")


def register_schema(store: ConfigStore) -> None:
    """Put the schema, each dataset group's and the launcher's node in Hydra's ConfigStore;
    `config.yaml` lists the schema first in its defaults, each conf/dataset/ file its group's."""
    store.store(name="pipebench_schema", node=_writable(OmegaConf.structured(PipebenchConfig)))
    for name, group in DATASET_GROUPS.items():
        store.store(group=SCHEMA_GROUP, name=name, node=_writable(OmegaConf.structured(group)))
    register_launcher_config(store)
