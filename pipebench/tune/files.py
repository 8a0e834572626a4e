"""What `pipebench tune` writes into its results folder (docs/tune.md's Output): tune.csv, best.yaml,
tune.md with tune.png, and the recommended variant's `conf/transform/<chain>.yaml` in a config folder
of its own (the results folder itself is data, not a config folder); and the text it prints.
"""

import math
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from pipebench.base.csv_cells import csv_text
from pipebench.base.io import write_text_atomic
from pipebench.base.tables import markdown_table
from pipebench.model.judging import DEFAULT_THRESHOLD, Spread
from pipebench.report.plots import FIGURE_SIZE, write_png
from pipebench.tune.chain_code import chain_code
from pipebench.tune.objective import Objective, Round, cpu_ms, pss_mb, rate_spread, starvation
from pipebench.tune.race import FAILED, UNRUN, RaceOutcome
from pipebench.tune.recommend import Recommendation
from pipebench.tune.space import SETTING_KEYS, Dropped, Point
from pipebench.tune.state import TUNE_MD

__all__ = ["BEST_YAML", "TUNE_CSV", "TUNE_MD", "TUNE_PNG", "Tuned", "paste_lines", "unresolved_line", "write_tune"]

TUNE_CSV = "tune.csv"
TUNE_PNG = "tune.png"
BEST_YAML = "best.yaml"
# The config folder tune writes for the run line, and in it the recommended chain's config where it
# is one of explore's variants (a `transform` config).
CONFIG_DIR = "conf"
VARIANT_FILE = CONFIG_DIR + "/transform/{}.yaml"
TUNE_COLUMNS = ["point", *SETTING_KEYS, "stage", "rounds", "samples_per_s", "samples_per_s_low",
                "samples_per_s_high", "spread", "predicted_samples_per_s", "cpu_ms_per_sample", "pss_mb",
                "starvation_pct", "verdict"]
# The columns tune.md's table of raced points shows.
RACED_COLUMNS = ["point", "stage", "rounds", "samples_per_s", "samples_per_s_low", "samples_per_s_high",
                 "cpu_ms_per_sample", "pss_mb", "starvation_pct", "verdict"]
RECOMMENDED, BEST, NEAR = "recommended", "best (not the cheapest)", "within noise of the best"
UNRESOLVED = "unresolved: not told apart from the best, nor shown as fast"
# tune.png's colour for each kind of verdict.
VERDICT_COLOURS = {RECOMMENDED: "tab:green", BEST: "tab:blue", NEAR: "tab:cyan"}
OUT_COLOUR = "tab:grey"


@dataclass(frozen=True)
class Tuned:
    """Everything a tune run found, for its files (no file is read back)."""

    chain: str
    objective: Objective
    budget_s: float
    spent_s: float
    points: Mapping[str, Point]
    pruned: Sequence[Dropped]
    predicted: Mapping[str, float]
    race: RaceOutcome
    recommendation: Optional[Recommendation]
    # The probe: each chain's workers=0 rounds, and what became of the chain.
    probe: Mapping[str, Sequence[Round]] = field(default_factory=dict)
    probe_verdicts: Mapping[str, str] = field(default_factory=dict)
    verification: str = ""
    # The recommended chain's config when it is one of explore's variants, for best.yaml.
    chain_config: Optional[Mapping[str, object]] = None
    notes: Sequence[str] = ()
    # The user's overrides that no point sets (dataset, consumer, run...), for the run line.
    overrides: Sequence[str] = ()
    # Findings that come first in tune.md (a chain whose probe crashed), and the warning the
    # recommendation carries ('' when none: its chain shares no move with a crashed one).
    warnings: Sequence[str] = ()
    pick_warning: str = ""


@dataclass(frozen=True)
class Trial:
    """A point: what tune.png and tune.md's table read of it, and its other cells of tune.csv."""

    # The race stage it reached, else `probe` or `pruned`.
    stage: Union[int, str]
    verdict: str
    # Its raced rounds' samples/s and interval (None where the race measured none).
    spread: Optional[Spread]
    cells: Mapping[str, object]

    @property
    def raced(self) -> bool:
        """A point of the race, measured or failed at a stage."""
        return isinstance(self.stage, int) and self.stage > 0

    @property
    def row(self) -> Dict[str, object]:
        """Its tune.csv row."""
        return {**self.cells, "stage": self.stage, "verdict": self.verdict}


def _figures(rounds: Sequence[Round], spread: Spread) -> Dict[str, object]:
    return {"rounds": len(rounds), "samples_per_s": spread.value, "samples_per_s_low": spread.low,
            "samples_per_s_high": spread.high, "spread": spread.kind, "cpu_ms_per_sample": cpu_ms(rounds),
            "pss_mb": pss_mb(rounds), "starvation_pct": starvation(rounds)}


def _verdict(name: str, tuned: Tuned) -> str:
    chosen = tuned.recommendation
    if chosen is not None and name == chosen.pick:
        return RECOMMENDED if chosen.met else f"{RECOMMENDED}: the closest, as nothing met the objective"
    if chosen is not None and name == chosen.best:
        return BEST
    if chosen is not None and name in chosen.near:
        return NEAR
    if chosen is not None and name in chosen.unresolved:
        return UNRESOLVED
    if name in tuned.race.out:
        stage, why = tuned.race.out[name]
        return f"out at stage {stage}: {why}"
    return f"left in the race: {tuned.race.stop}"


def _stage_of(name: str, race: RaceOutcome) -> int:
    return max((s.number for s in race.stages if name in s.entrants), default=0)


def trials(tuned: Tuned) -> List[Trial]:
    """One a point: the raced ones in the order first measured, then those whose jobs failed, then
    the probe's, then the pruned."""
    out = []
    failed = [n for n in tuned.race.out if n not in tuned.race.rounds]
    for name in [*tuned.race.rounds, *failed]:
        rounds = tuned.race.rounds.get(name)
        spread = rate_spread(rounds) if rounds is not None else None
        figures = _figures(rounds, spread) if rounds is not None else {"rounds": 0}
        stage = _stage_of(name, tuned.race) if rounds is not None else tuned.race.out[name][0]
        out.append(Trial(stage, _verdict(name, tuned), spread, {
            "point": name, **tuned.points[name].settings(), **figures,
            "predicted_samples_per_s": tuned.predicted.get(name, math.nan)}))
    for chain, rounds in tuned.probe.items():
        out.append(Trial("probe", tuned.probe_verdicts.get(chain, ""), None, {
            "point": f"{chain} (probe)", "transform": chain, "workers": 0, **_figures(rounds, rate_spread(rounds))}))
    for dropped in tuned.pruned:
        out.append(Trial("pruned", f"pruned: {dropped.reason}", None, {
            "point": dropped.point.name, **dropped.point.settings(), "rounds": 0,
            "predicted_samples_per_s": tuned.predicted.get(dropped.point.name, math.nan)}))
    return out


def unresolved_line(chosen: Recommendation, stop: str) -> str:
    """Why the race left points it could not resolve, and what that means for the pick."""
    return (f"not resolved: {', '.join(chosen.unresolved)} could not be told apart from {chosen.best}, nor shown "
            f"within {DEFAULT_THRESHOLD:.0%} of it (their intervals overlap and are too wide to bound the gap; the "
            f"race stopped: {stop}), so the pick is not the cheapest of them; a larger --budget-s, tune.rounds or "
            "tune.stages measures more rounds")


def _plot(points: Sequence[Trial]) -> Figure:
    raced = [t for t in points if t.raced and t.spread is not None]
    figure = Figure(figsize=FIGURE_SIZE, layout="constrained")
    axes = figure.subplots()
    for i, trial in enumerate(raced, 1):
        value, low, high = float(trial.spread.value), float(trial.spread.low), float(trial.spread.high)
        error = [[max(value - low, 0) if math.isfinite(low) else 0], [max(high - value, 0) if math.isfinite(high) else 0]]
        colour = VERDICT_COLOURS.get(trial.verdict.split(":")[0], OUT_COLOUR)
        axes.errorbar([i], [value], yerr=np.array(error), marker="*" if colour != OUT_COLOUR else "o", capsize=3,
                      color=colour, markersize=12 if colour != OUT_COLOUR else 6)
    axes.set_xlabel("trial (in the order the race first measured it)")
    axes.set_ylabel("samples/s (median over its rounds, with its interval)")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    figure.suptitle("pipebench tune: the search (star: recommended, within noise; grey: out)")
    return figure


def paste_lines(point: Point) -> List[str]:
    """The recommended loader as code to paste into a training script, for its backend."""
    workers, batch = point.workers, point.batch_size
    if point.backend == "threads":
        lines = ["import torchdata.nodes as nodes",
                 f"node = nodes.ParallelMapper(nodes.IterableWrapper(sampler), dataset.__getitem__, "
                 f"num_workers={workers}, in_order=True, method=\"thread\")",
                 f"node = nodes.Batcher(node, batch_size={batch}, drop_last=True)",
                 "node = nodes.Mapper(node, collate_fn)"]
        lines += ["node = nodes.PinMemory(node)"] * point.pin_memory
        return [*lines, f"node = nodes.Prefetcher(node, prefetch_factor={point.prefetch_factor})",
                "loader = nodes.Loader(node)"]
    if point.backend == "spdl":
        pin = ".pipe(lambda batch: batch.pin_memory())" if point.pin_memory else ""
        return ["from spdl.pipeline import PipelineBuilder",
                f"loader = (PipelineBuilder().add_source(sampler).pipe(dataset.__getitem__, concurrency={workers}, "
                f"output_order=\"input\").aggregate({batch}, drop_last=True).pipe(collate_fn){pin}"
                f".add_sink({point.prefetch_factor}).build(num_threads={workers + 1}))"]
    pool = f", prefetch_factor={point.prefetch_factor}, persistent_workers={point.persistent_workers}" \
        if workers > 0 else ""  # DataLoader raises on them without workers
    return [f"DataLoader(dataset, batch_size={batch}, shuffle=True, num_workers={workers}{pool}, "
            f"pin_memory={point.pin_memory})"]


def run_line(point: Point, config_dir: str, overrides: Sequence[str] = ()) -> str:
    """The `pipebench run` command of the point, after the user's other `overrides` (`config_dir`:
    where its chain's config is, if not pipebench's)."""
    settings = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in point.settings().items()]
    return shlex.join(["pipebench", "run", *(["--config-dir", config_dir] if config_dir else []), *overrides,
                       *settings])


def best_config(point: Point, chain_config: Optional[Mapping[str, object]]) -> str:
    """best.yaml's text: the point's keys nested as a config, with the chain's steps where it is a variant."""
    loader = {k.split(".", 1)[1]: v for k, v in point.settings().items() if k.startswith("loader.")}
    body: Dict[str, object] = {"workers": point.workers, "loader": loader}
    if chain_config is not None:
        body["transform"] = dict(chain_config)
    header = (f"# @package _global_\n# pipebench tune: the recommended settings for transform={point.chain}.\n"
              "# Merge it onto a pipebench config, or copy it to <your config dir>/tune/best.yaml and run\n"
              "# `pipebench run --config-dir <your config dir> +tune=best`.\n")
    return header + OmegaConf.to_yaml(body)


def _grouped(pruned: Sequence[Dropped]) -> List[Dict[str, object]]:
    """The pruned points by the rule that dropped them: how many, and one of them."""
    counts = Counter(d.rule for d in pruned)
    first = {d.rule: d for d in reversed(pruned)}
    return [{"rule": key, "points": counts[key], "for example": f"{first[key].point.name}: {first[key].reason}"}
            for key in counts]


def chain_lines(chain: str, chain_config: Optional[Mapping[str, object]]) -> List[str]:
    """The recommended chain as code to paste (a fenced block), or the line saying it is the user's own."""
    if chain_config is None:
        return [f"the chain: yours, unchanged (transform={chain})"]
    return [f"the chain ({chain}, explore's variant of yours), as code:", "", "```python",
            *chain_code(chain_config), "```"]


def tune_markdown(folder: Path, tuned: Tuned, points: Sequence[Trial], config_dir: str) -> str:
    lines = [f"# pipebench tune: transform={tuned.chain}", "",
             *(f"**warning: {warning}**" for warning in tuned.warnings), *([""] if tuned.warnings else []),
             f"objective: {tuned.objective.name}; budget {tuned.budget_s:g} s, spent {tuned.spent_s:.0f} s", ""]
    lines += [f"note: {note}" for note in tuned.notes] + ([""] if tuned.notes else [])
    if tuned.probe:
        lines += ["## chains (explore's variants at workers=0, the cost model's probe)", ""]
        lines += [f"- {chain}: {verdict}" for chain, verdict in tuned.probe_verdicts.items()] + [""]
    unmeasured = Counter(why for n, (_, why) in tuned.race.out.items() if n not in tuned.race.rounds)
    raced = len(tuned.race.rounds) + sum(unmeasured.values())
    never = [f"{unmeasured[FAILED]} never measured: their jobs failed twice"] * bool(unmeasured[FAILED]) + \
        [f"{unmeasured[UNRUN]} never measured: the budget was spent before their jobs ran"] * bool(unmeasured[UNRUN])
    lines += [f"## the space: {raced + len(tuned.pruned)} points, {len(tuned.pruned)} pruned by the model, "
              f"{raced} raced" + (f" ({'; '.join(never)})" if never else ""), ""]
    if tuned.pruned:
        lines += [markdown_table(_grouped(tuned.pruned), ["rule", "points", "for example"]).rstrip(), "",
                  f"every pruned point and its reason: {TUNE_CSV}", ""]
    lines += ["## the race", ""]
    for stage in tuned.race.stages:
        lines.append(f"- stage {stage.number}: {len(stage.entrants)} points, rounds {stage.length:g}x stage 1's, "
                     f"{stage.seconds:.0f} s; best {stage.verdict.best}; {len(stage.verdict.kept)} kept")
    lines += [f"- stopped: {tuned.race.stop}", "",
              markdown_table([t.row for t in points if t.raced], RACED_COLUMNS).rstrip(), "",
              f"![the search]({TUNE_PNG})", ""]
    chosen = tuned.recommendation
    if chosen is not None:
        pick = tuned.points[chosen.pick]
        variant = VARIANT_FILE.format(pick.chain) if tuned.chain_config is not None else ""
        run_dir = config_dir if config_dir or not variant else str(folder / CONFIG_DIR)
        copy = f"copy {folder / variant} into {config_dir}/transform/, then: " if variant and config_dir else ""
        lines += ["## recommendation", ""]
        if tuned.pick_warning:
            lines += [f"**warning: {tuned.pick_warning}**", ""]
        if chosen.met:
            lines += [f"within noise of the best ({chosen.best}): {', '.join(chosen.near)}",
                      f"recommended, the cheapest of them (fewest CPU ms a sample, then least summed PSS): "
                      f"{chosen.pick}"]
            if chosen.stricter:
                lines += ["", chosen.stricter]
            if chosen.unresolved:
                lines += ["", unresolved_line(chosen, tuned.race.stop)]
        else:
            lines += [f"nothing met the objective; the closest: {chosen.pick} ({chosen.unmet})"]
        if tuned.verification:
            lines += ["", tuned.verification]
        lines += ["", "paste into your script:", "", *chain_lines(pick.chain, tuned.chain_config), "",
                  "the loader:", "", "```python", *paste_lines(pick), "```", "",
                  f"or run it ({copy or 'as it is'}):", "", "```", run_line(pick, run_dir, tuned.overrides), "```", "",
                  f"as a config: {BEST_YAML}", ""]
    return "\n".join(lines) + "\n"


def write_tune(folder: Path, tuned: Tuned, config_dir: str = "") -> str:
    """tune.csv, tune.png, best.yaml (when something was recommended) and tune.md; returns the markdown.
    `config_dir`: the --config-dir the run line needs for a variant chain's config."""
    points = trials(tuned)
    write_text_atomic(folder / TUNE_CSV, csv_text([t.row for t in points], TUNE_COLUMNS))
    write_png(_plot(points), folder / TUNE_PNG)
    if tuned.recommendation is not None:
        pick = tuned.points[tuned.recommendation.pick]
        write_text_atomic(folder / BEST_YAML, best_config(pick, tuned.chain_config))
        if tuned.chain_config is not None:
            path = folder / VARIANT_FILE.format(pick.chain)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, f"# pipebench tune: explore's variant {path.stem}\n"
                              + OmegaConf.to_yaml(dict(tuned.chain_config)))
    markdown = tune_markdown(folder, tuned, points, config_dir)
    write_text_atomic(folder / TUNE_MD, markdown)
    return markdown
