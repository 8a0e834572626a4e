"""Write exported pipelines (`attach.export_pipeline`) as a config dir `pipebench run --config-dir` reads.

Per loader, named after its creation site (`train.py:57` -> `train_57`): `dataset/`, `transform/`,
`loader/` and, where attach measured the script's own step, `consumer/` configs (so `run` and `tune`
feed a step as long as the script's, not the default 30 ms), and the `pipebench run` / `explore`
commands that use them; `EXPORT_NOTES.md` lists what each export left out or changed, and why.
`workers` is a top-level setting, which a loader config cannot set, so it goes on the command.
"""

import re
import shlex
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import yaml

from pipebench.attach.export_pipeline import ExportedPipeline

__all__ = ["NOTES_FILE", "config_name", "write_exports"]

NOTES_FILE = "EXPORT_NOTES.md"
# A config name Hydra reads as one word in an override (`dataset=train_57`).
_NOT_NAME = re.compile(r"[^A-Za-z0-9_]+")


def config_name(site: str, taken: Sequence[str] = ()) -> str:
    """`train.py:57` -> `train_57`; a suffix where two loaders would share a name."""
    file, _, line = site.rpartition(":")
    base = _NOT_NAME.sub("_", f"{Path(file).stem}_{line}" if file else site).strip("_") or "loader"
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name


def _write_yaml(path: Path, header: str, body: Dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    path.write_text(comment + yaml.safe_dump(body, sort_keys=False, default_flow_style=False))


def _commands(folder: Path, name: str, exported: ExportedPipeline) -> Tuple[str, str]:
    groups = [f"dataset={name}"] if exported.dataset is not None else []
    groups += [f"transform={name}", f"loader={name}", *([f"consumer={name}"] if exported.consumer else []),
               f"workers={exported.workers}"]
    tail = f"--config-dir {shlex.quote(str(folder))} {' '.join(groups)}"
    return f"pipebench run {tail}", f"pipebench explore {tail}"


def _write_one(folder: Path, site: str, name: str, exported: ExportedPipeline) -> List[str]:
    """One loader's configs; its lines of the notes file, up to its commands."""
    source = f"exported by pipebench attach from the loader created at {site}"
    if exported.dataset is not None:
        _write_yaml(folder / "dataset" / f"{name}.yaml", source, exported.dataset)
    _write_yaml(folder / "transform" / f"{name}.yaml", f"{source}: its recipe, step by step",
                {"per_sample": list(exported.per_sample), "per_batch": []})
    _write_yaml(folder / "loader" / f"{name}.yaml",
                f"{source}\nnum_workers={exported.workers}: give it as workers={exported.workers} (a top-level setting)",
                exported.loader)
    if exported.consumer is not None:
        _write_yaml(folder / "consumer" / f"{name}.yaml",
                    f"{source}: the script's own step as attach measured it (median, and a normal spread from "
                    "its IQR), emulated", exported.consumer)
    notes = [f"- {note}" for note in exported.notes] or ["- everything was exported"]
    return [f"## {name} (the loader created at {site})", "", *notes, ""]


def write_exports(folder: "str | Path", exports: Sequence[Tuple[str, ExportedPipeline]]) -> List[str]:
    """Write each (site, export) into `folder`; the lines to print: what was left out, and the commands."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names: List[str] = []
    notes = ["# What pipebench attach exported", ""]
    printed = []
    for site, exported in exports:
        name = config_name(site, names)
        names.append(name)
        run, explore = _commands(folder, name, exported)
        notes += [*_write_one(folder, site, name, exported), "```", run, explore, "```", ""]
        printed += [f"exported {site} to {folder} as {name}:"]
        printed += [f"  not exported: {note}" if "not exported" in note or "left out" in note else f"  note: {note}"
                    for note in exported.notes]
        if exported.dataset is None:
            printed.append("  no dataset config: give one on the command (dataset=... or your own)")
        printed += [f"  {run}", f"  {explore}"]
    (folder / NOTES_FILE).write_text("\n".join(notes))
    return printed
