"""What to install for a feature whose library is missing: one pip line, in the form of this install.

Every "needs an extra" message goes through `install_line`, so a user is told `pip install ".[threads,spdl]"`
where pipebench was installed from a clone (PEP 610's direct_url.json names a local folder; `-e` for an
editable one), `pip install "pipebench[threads,spdl] @ URL"` from a VCS or archive URL, and
`pip install "pipebench[threads,spdl]"` from an index; and `missing_line` names every missing library
of a sweep or an exploration in that one line, so a second run does not stop at the next one.
"""

import importlib.util
import json
from dataclasses import dataclass, field
from importlib.metadata import distributions
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence
from urllib.parse import urlparse
from urllib.request import url2pathname

from pipebench.base.typed_json import parse

__all__ = ["DISTRIBUTION", "MissingExtra", "install_line", "installed", "missing_line"]

DISTRIBUTION = "pipebench"
# PEP 610: pip writes it into the installed dist-info for a direct URL, never for an index install.
DIRECT_URL_FILE = "direct_url.json"


@dataclass(frozen=True)
class MissingExtra:
    """A feature that cannot run here for want of a library, and the extra that installs it."""

    feature: str  # what the user asked for or could have had: "loader.backend=threads", "region_decode"
    library: str  # the library it lacks, as users know it: "torchdata", "nvImageCodec"
    extra: str  # pipebench's extra that installs it: "threads"


def installed(module: str) -> bool:
    """Whether `module` can be imported here, found without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


@dataclass(frozen=True)
class DirInfo:
    """PEP 610's `dir_info`: a local folder, installed editable or not."""

    editable: bool = False


@dataclass(frozen=True)
class VcsInfo:
    """PEP 610's `vcs_info`: the version control system of a VCS URL."""

    vcs: Optional[str] = None


@dataclass(frozen=True)
class DirectUrl:
    """PEP 610's direct_url.json: the URL pip installed from, and a folder's or a VCS's info (an
    archive's URL has neither)."""

    url: str = ""
    dir_info: Optional[Mapping[str, Any]] = None
    vcs_info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def editable(self) -> bool:
        return self.dir_info is not None and parse(DirInfo, self.dir_info).editable

    @property
    def vcs(self) -> Optional[str]:
        return parse(VcsInfo, self.vcs_info).vcs


def _direct_url() -> DirectUrl:
    """The installed distribution's direct_url.json (no URL for an index install or none). A source tree's
    pipebench.egg-info (left by a build, found first when the clone is the working directory) has
    none, so the first distribution that has one is pip's record of this install."""
    for dist in distributions(name=DISTRIBUTION):
        text = dist.read_text(DIRECT_URL_FILE)
        if text:
            return parse(DirectUrl, json.loads(text))
    return DirectUrl()


def install_line(extras: Iterable[str]) -> str:
    """The pip command that adds `extras` (in order, each once) to pipebench as it was installed."""
    wanted = f"[{','.join(dict.fromkeys(extras))}]"
    direct = _direct_url()
    url = direct.url
    if direct.dir_info is not None and url.startswith("file:"):
        folder = Path(url2pathname(urlparse(url).path))
        where = "." if folder.resolve() == Path.cwd().resolve() else str(folder)
        editable = "-e " if direct.editable else ""
        return f'pip install {editable}"{where}{wanted}"'
    if url:
        vcs = direct.vcs
        return f'pip install "{DISTRIBUTION}{wanted} @ {f"{vcs}+" if vcs else ""}{url}"'
    return f'pip install "{DISTRIBUTION}{wanted}"'


def missing_line(missing: Sequence[MissingExtra]) -> str:
    """One line for every missing library: what needs each, then one pip command for all their extras,
    e.g. `loader.backend=threads needs torchdata; loader.backend=spdl needs spdl: pip install ".[threads,spdl]"`."""
    needing: Dict[str, List[str]] = {}
    for item in missing:
        needing.setdefault(item.library, []).append(item.feature)
    needs = "; ".join(f"{', '.join(features)} {'needs' if len(features) == 1 else 'need'} {library}"
                      for library, features in needing.items())
    return f"{needs}: {install_line(item.extra for item in missing)}"
