"""A verb's own `PREFIX.*` overrides (`tune.*`, `storage_check.*`), taken off the overrides its jobs get.

They are parsed with Hydra's override parser and merged into the verb's options dataclass as a
structured config, whose `__post_init__` holds the range checks: a typo or a bad value is one line
naming the key, and the jobs never see them.
"""

from typing import Any, Dict, List, Sequence, Tuple, Type, TypeVar

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from pipebench.base.errors import ConfigError
from pipebench.config.compose import one_line

__all__ = ["split_prefixed"]

Options = TypeVar("Options")


def split_prefixed(overrides: Sequence[str], prefix: str, options: Type[Options]) -> Tuple[Options, List[str]]:
    """The `prefix` overrides (`tune.`) as checked `options`, and the other overrides as given, in their
    order. A comma list (`tune.workers=0,2,4`) is the same list as `[0,2,4]`."""
    ours = [o for o in overrides if o.lstrip("+~").startswith(prefix)]
    rest = [o for o in overrides if not o.lstrip("+~").startswith(prefix)]
    try:
        parsed = OverridesParser.create().parse_overrides(ours)
    except OverrideParseException as exc:
        raise ConfigError(f"{exc.override.partition('=')[0]}: {one_line(exc)}") from exc
    given: Dict[str, Any] = {}
    for override in parsed:
        value = list(override.sweep_iterator()) if override.is_sweep_override() else override.value()
        given[override.key_or_group[len(prefix):]] = value
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(options), given)), rest
    except ConfigKeyError as exc:
        keys = ", ".join(OmegaConf.structured(options))
        raise ConfigError(f"{prefix}{exc.full_key}: no such key ({prefix}* keys: {keys})") from exc
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{prefix}{getattr(exc, 'full_key', '')}: {one_line(exc)}") from exc
