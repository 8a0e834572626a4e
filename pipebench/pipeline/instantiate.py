"""One `_target_` node to a live object, with a bad target or argument as a one-line ConfigError."""

from typing import Any, Mapping

from hydra.errors import InstantiationException
from hydra.utils import instantiate

from pipebench.base.errors import ConfigError, PipebenchError
from pipebench.config.target_node import TargetNode


def _joined(text: str) -> str:
    """A message that spans lines, whole on one: Hydra's "Error loading 'x.Y':" is followed by the
    import error and a hint on lines of their own."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(line if line.endswith(":") or i == len(lines) - 1 else f"{line};" for i, line in enumerate(lines))


def instantiate_node(node: Mapping[str, Any], where: str) -> Any:
    """Instantiate one `_target_` node; a bad target or argument becomes a one-line ConfigError."""
    try:
        return instantiate(dict(node), _convert_="all")
    except InstantiationException as exc:
        cause = exc.__cause__
        if isinstance(cause, PipebenchError):
            raise cause from exc
        raise ConfigError(f"{where} ({TargetNode.of(node).target}): {_joined(str(cause if cause is not None else exc))}") \
            from exc
