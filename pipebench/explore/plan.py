"""`pipebench explore`: find a chain's variants, check them, and lay out one interleaved sweep.

Each variant is checked for equivalence with the base chain and registered as `transform=<name>` in
Hydra's ConfigStore, in memory; the files written for the reader are never read back: a resume
regenerates the variants (deterministic), so a file planted in the folder is never composed or run.
"""

import dataclasses
import itertools
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from torch.utils.data import IterableDataset

from pipebench.base.cores import usable_cores
from pipebench.base.csv_cells import csv_text
from pipebench.base.errors import ConfigError
from pipebench.base.extras import MissingExtra, missing_line
from pipebench.base.io import folder_safe, write_json_atomic, write_text_atomic
from pipebench.base.significance import DOWN, MIN_SAMPLES, UP, against_base
from pipebench.base.tables import markdown_table
from pipebench.config.compose import job_spec_composer, one_line
from pipebench.config.specs import TRANSFORM_GROUP
from pipebench.config.sweep_axes import expand_auto_workers
from pipebench.explore.equivalence import (
    DEFAULT_MAX_PIXEL_DIFF,
    FAILS,
    Equivalence,
    chain_failure,
    check,
)
from pipebench.explore.chain import DEVICE_MOVES, Chain, Exploration, SampleSource, Variant
from pipebench.explore.variants import LoaderSetting, explore
from pipebench.explore.variant_row import BASE_VERDICT, VariantRow
from pipebench.explore.waterfall import WATERFALL_COLUMNS, allowed, waterfall, winner
from pipebench.pipeline.build import build_dataset
from pipebench.pipeline.consumers import on_device_of
from pipebench.pipeline.loader_backends import BACKENDS, backend_missing, backend_problem
from pipebench.pipeline.recipe import open_recipes
from pipebench.record.figures import Summary
from pipebench.record.jobs import ROUND_KEY, JobResult, edits_chain, override_key, varying_keys
from pipebench.record.results import load_job_results
from pipebench.record.resume import (
    INVOCATION_FILE,
    InvocationChoice,
    dated,
    latest_unfinished,
    new_folder,
)
from pipebench.record.stored import versioned

# Four interleaved rounds by default: variants of one chain often differ by 10-30%, about the
# round-to-round spread of one job on a shared machine, so one round cannot rank them, and the
# one rule for "is it real?" (base/significance.py, as compare uses) gives no verdict on fewer
# than MIN_SAMPLES a side. Five (as the nightly) would take the seed chain's variants past ten
# minutes on a 2-core machine.
DEFAULT_ROUNDS = MIN_SAMPLES
# What the words suggest when the default rounds cannot resolve a difference: a paired t-test on
# 4 rounds has 3 degrees of freedom, and Holm over a chain's ~8 variants asks p < 0.006 of the
# best one. Measured on the ImageNet recipe here, a 1.48x winner's per-round log ratios had a
# standard deviation of 0.15: p = 0.016 on 4 rounds (not resolved), about 0.0002 on 8.
RESOLVING_ROUNDS = 2 * DEFAULT_ROUNDS
# Defaults explore adds unless the command line sets them (`unset_defaults`): the rounds above; a
# shorter job (>= 10 steps and >= 2 s after warm-up), as more rounds of short jobs resist drift
# better than fewer long ones; and no profiler trace, whose extra steps cost time per job.
EXPLORE_DEFAULTS = (("rounds", str(DEFAULT_ROUNDS)), ("run.steps", "10"), ("run.min_time_s", "2"),
                    ("trace", "none"))
# Written for the reader (a variant to copy into one's own configs), never read back.
VARIANTS_DIR = "variants"
# The override run_command puts in front of a sweep for --config-dir (and an older folder's variants/).
SEARCH_PATH_KEY = "hydra.searchpath="
CONFIG_PROVIDER = "pipebench explore"
VARIANTS_JSON = "variants.json"
EQUIVALENCE_MD = "equivalence.md"
EQUIVALENCE_CSV = "equivalence.csv"
EXPLORE_MD = "explore.md"
EXPLORE_CSV = "explore.csv"
WATERFALL_MD = "waterfall.md"
WATERFALL_CSV = "waterfall.csv"
# The winning chain as a ready-to-use transform config, per setting.
WINNER_DIR = "winner"
EQUIVALENCE_COLUMNS = ["variant", "moves", "verdict", "measured", "detail"]
# What the equivalence table says of a device move's variants on a host without the device.
NO_DEVICE = "no: no CUDA device here (checked on the CPU; measured only where a GPU exists)"
EXPLORE_COLUMNS = ["variant", "setting", "verdict", "rounds", "samples_per_s", "samples_per_s_min",
                   "samples_per_s_max", "speedup", "rate_vs_base", "cpu_ms_per_sample", "cpu_speedup", "cpu_vs_base",
                   "samples_per_s_epoch", "batch_mb", "ready_next_ms"]
# Overrides that every row of one variant shares or that name the variant: not part of a "setting".
ROW_KEYS_IGNORED = ("transform", ROUND_KEY)


@dataclass(frozen=True)
class Checked:
    variant: Variant
    # None for the base chain, which is the reference.
    equivalence: Optional[Equivalence]
    # Why a checked variant is not measured here (a device move on a host without the device).
    unmeasured: str = ""

    @property
    def verdict(self) -> str:
        return BASE_VERDICT if self.equivalence is None else self.equivalence.verdict

    @property
    def measured(self) -> bool:
        return self.verdict != FAILS and not self.unmeasured


@dataclass(frozen=True)
class Plan:
    """What explore will measure: its folder, the sweep overrides, the variants and their verdicts."""

    invocation_dir: Path
    overrides: Tuple[str, ...]
    checked: Tuple[Checked, ...]
    not_applied: Tuple[str, ...]
    resumed: Optional[InvocationChoice] = None
    # The moves among not_applied that would apply but for a library not installed.
    missing: Tuple[MissingExtra, ...] = ()


@dataclass(frozen=True)
class NoVariants:
    """No move applies to the chain: nothing to explore, and why."""

    base: str
    reasons: Tuple[str, ...]


def check_overrides(overrides: Sequence[str]) -> None:
    """explore moves one named chain: no transform sweep and no `transform.*` edits (indices shift)."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as exc:
        raise ConfigError(one_line(exc)) from exc
    for override in parsed:
        key = override.get_key_element().lstrip("+~")
        if key == "transform" and override.is_sweep_override():
            raise ConfigError(f"explore takes one chain, got a sweep: {override.input_line}; explore each on its own")
        if edits_chain(override.input_line):
            raise ConfigError(f"explore cannot apply {override.input_line} to variants (their steps move); "
                              "put the edited chain in a config file and pass transform=NAME")


def unset_defaults(defaults: Sequence[Tuple[str, str]], overrides: Sequence[str]) -> List[str]:
    """`key=value` for each default the command line sets neither by its key nor by its group (`run=quick`
    keeps its own budget); explore's and tune's rounds both follow it."""
    given = {override_key(o) for o in overrides}
    return [f"{k}={v}" for k, v in defaults if k not in given and k.partition(".")[0] not in given]


def _folder_safe(name: str) -> str:
    return folder_safe(name) or "chain"


def _write_variant_configs(folder: Path, variants: Sequence[Variant]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for variant in variants:
        header = f"# pipebench explore: {variant.name}\n" + "".join(f"# - {c}\n" for c in variant.changes)
        write_text_atomic(folder / f"{variant.name}.yaml", header + OmegaConf.to_yaml(variant.chain.as_config()))


def _equivalence_rows(checked: Sequence[Checked]) -> List[Dict[str, object]]:
    rows = []
    for item in checked:
        eq = item.equivalence
        measured = "yes" if item.measured else (item.unmeasured or "no: it fails")
        rows.append({"variant": item.variant.name, "moves": "+".join(item.variant.moves) or "-",
                     "verdict": item.verdict, "measured": measured, "equivalent": eq.equivalent if eq else True,
                     "test": eq.test if eq else "", "p_value": eq.p_value if eq else None,
                     "max_abs_diff": eq.max_abs_diff if eq else None,
                     "detail": eq.detail if eq else "the chain as configured; every variant is checked against it"})
    return rows


def write_variant_files(invocation_dir: Path, checked: Sequence[Checked], not_applied: Sequence[str]) -> str:
    """variants.json, equivalence.md and equivalence.csv; returns the markdown table."""
    rows = _equivalence_rows(checked)
    payload = {
        "base": checked[0].variant.name,
        "not_applied": list(not_applied),
        "variants": [{"name": item.variant.name, "moves": list(item.variant.moves),
                      "changes": list(item.variant.changes), "chain": item.variant.chain.as_config(),
                      "draws_per_batch": list(item.variant.draws_per_batch), "measured": item.measured,
                      "equivalence": {k: row[k] for k in ("verdict", "equivalent", "test", "p_value",
                                                          "max_abs_diff", "detail")}}
                     for item, row in zip(checked, rows)],
    }
    write_json_atomic(invocation_dir / VARIANTS_JSON, versioned(payload))
    markdown = markdown_table(rows, EQUIVALENCE_COLUMNS) + "".join(f"not applied: {reason}\n" for reason in not_applied)
    write_text_atomic(invocation_dir / EQUIVALENCE_MD, markdown)
    write_text_atomic(invocation_dir / EQUIVALENCE_CSV, csv_text(rows, list(rows[0])))
    return markdown


def unfinished_exploration(results_dir: Path, base: str, overrides: Sequence[str]) -> Optional[InvocationChoice]:
    """The latest explore folder of this chain whose sweep was `overrides` and whose jobs are not all
    done; the config search path in front of its recorded command (SEARCH_PATH_KEY) is left out of the match."""
    wanted = expand_auto_workers(list(overrides), usable_cores())
    return latest_unfinished(
        results_dir.glob(f"*-explore-{_folder_safe(base)}*/{INVOCATION_FILE}"),
        lambda record: [c for c in record.command if not c.startswith(SEARCH_PATH_KEY)] == wanted)


def store_variant(variant: Variant) -> None:
    """`transform=<name>` in Hydra's ConfigStore (explore's sweep and tune's points compose it); a loader
    move's variant also sets its loader key, so it is a global package."""
    store = ConfigStore.instance()
    if not variant.loader:
        store.store(group=TRANSFORM_GROUP, name=variant.name, node=variant.chain.as_config(), provider=CONFIG_PROVIDER)
        return
    store.store(group=TRANSFORM_GROUP, name=variant.name, package="_global_", provider=CONFIG_PROVIDER,
                node={TRANSFORM_GROUP: variant.chain.as_config(), "loader": dict(variant.loader)})


def _loader_settings_that_hold(found: Exploration, first_job: Sequence[str], compose_one) -> Exploration:
    """Drop the loader moves whose setting does not reach the job: a command-line override or the
    chosen loader config (loader=seed sets prefetch_factor and pin_memory) is applied after the
    chain's config, so the user's value wins, and the move says so."""
    kept, dropped = [], []
    for variant in found.variants:
        if variant.loader:
            store_variant(variant)
            spec, _ = compose_one([o for o in first_job if override_key(o) != TRANSFORM_GROUP] +
                                  [f"{TRANSFORM_GROUP}={variant.name}"])
            key, value = variant.loader[0]
            if getattr(spec.loader, key) != value:
                dropped.append(f"{key}: loader.{key} is set after the chain (on the command line or by the loader "
                               "config), so explore leaves it as given")
                continue
        kept.append(variant)
    # One line a key, though a move with a variant per value (the backend) loses each of them.
    return dataclasses.replace(found, variants=tuple(kept), not_applied=(*found.not_applied, *dict.fromkeys(dropped)))


def _sample_fetcher(dataset: Any) -> Callable[[int], list]:
    """`fetch(n)`: the dataset's first n inputs (labels dropped), cycled where it holds fewer, read
    as the loader reads them: by index from a map-style dataset, by iterating an IterableDataset
    (which has no `dataset[i]`) of `(index, sample, target)` items (pipeline.timed_iterable).
    An empty dataset gives none."""
    if isinstance(dataset, IterableDataset):
        def fetch(n: int) -> list:
            first = [sample for _, sample, _ in itertools.islice(iter(dataset), n)]
            return [first[i % len(first)] for i in range(n)] if first else []
        return fetch

    def fetch_indexed(n: int) -> list:
        return [dataset[i % len(dataset)][0] for i in range(n)] if len(dataset) else []
    return fetch_indexed


@dataclass(frozen=True)
class CheckedVariants:
    """The chain `first_job` composes to and its variants, each checked; where its results go."""

    checked: Tuple[Checked, ...]
    not_applied: Tuple[str, ...]
    missing: Tuple[MissingExtra, ...]
    results_dir: str


def check_variants(first_job: Sequence[str], max_pixel_diff: int = DEFAULT_MAX_PIXEL_DIFF,
                   loader_moves: bool = True) -> Union[CheckedVariants, NoVariants]:
    """Generate the variants of the chain `first_job` composes to (with the loader moves unless
    `loader_moves` is false: tune searches the loader itself) and check each for equivalence with
    it; NoVariants, saying why, when no move applies."""
    device_here = torch.cuda.is_available()
    with job_spec_composer() as compose_one:
        spec, results_dir = compose_one(first_job)
        dataset = build_dataset(spec)
        others = {name: backend_problem(name, dataset) for name in BACKENDS if name != spec.loader.backend}
        lacking = tuple(m for m in (backend_missing(name, dataset) for name in others) if m is not None)
        setting = LoaderSetting(spec.workers, dataclasses.asdict(spec.loader), device_here, others, lacking)
        fetch = _sample_fetcher(dataset)
        first = fetch(1)
        source = SampleSource.of(first[0]) if first else None
        opened = open_recipes(spec.per_sample)  # a recipe object's steps move as a YAML list's do
        found = explore(spec.transform_name, Chain(opened.nodes, spec.per_batch, spec.on_device),
                        setting if loader_moves else None, source, on_device_of(spec.consumer))
        found = _loader_settings_that_hold(found, first_job, compose_one)
        found = dataclasses.replace(found, not_applied=(*found.not_applied, *(f"recipe: {n}" for n in opened.notes)))
    if len(found.variants) == 1:
        return NoVariants(found.base.name, found.not_applied)
    broken = chain_failure(found.base.chain, fetch, spec.run.seed)
    if broken:
        raise ConfigError(f"transform={found.base.name} fails on the dataset's first samples ({broken}): "
                          "explore checks each variant against it, so it needs a chain that runs on this dataset")

    checked = [Checked(found.base, None)]
    for variant in found.variants[1:]:
        print(f"explore: checking {variant.name}", flush=True)
        unmeasured = NO_DEVICE if variant.needs_device and not device_here else ""
        checked.append(Checked(variant, check(found.base.chain, variant, fetch, spec.run.seed, max_pixel_diff),
                               unmeasured))
    device_moves = sorted({m for item in checked if item.unmeasured for m in item.variant.moves if m in DEVICE_MOVES})
    if device_moves:
        print(f"notice: {', '.join(device_moves)}: no CUDA device here, so its variants are checked for equivalence "
              "on the CPU and not measured", flush=True)
    return CheckedVariants(tuple(checked), found.not_applied, found.missing, results_dir)


def plan_exploration(overrides: Sequence[str], first_job: Sequence[str], fresh: bool = False,
                     max_pixel_diff: int = DEFAULT_MAX_PIXEL_DIFF) -> Union[Plan, NoVariants]:
    """Generate and check the variants of the chain `first_job` composes to, and pick their folder (for
    `write_plan`): an interrupted exploration of the same chain and settings unless `fresh`, else a new
    one; NoVariants, creating nothing, when no move applies."""
    check_overrides(overrides)
    found = check_variants(first_job, max_pixel_diff)
    if isinstance(found, NoVariants):
        return found
    checked, results_dir = found.checked, found.results_dir
    kept = [o for o in overrides if override_key(o) != "transform"]
    defaults = unset_defaults(EXPLORE_DEFAULTS, overrides)
    names = ",".join(item.variant.name for item in checked if item.measured)
    swept = (*kept, *defaults, f"transform={names}")
    base = checked[0].variant.name
    resumed = None if fresh else unfinished_exploration(Path(results_dir), base, swept)
    invocation_dir = resumed.folder if resumed is not None else new_folder(
        dated(results_dir, f"explore-{_folder_safe(base)}"))
    return Plan(invocation_dir, swept, checked, found.not_applied, resumed, found.missing)


def write_plan(plan: Plan) -> str:
    """Register the variants for the sweep (the job processes get them with Hydra's own state) and
    write what explore found into its folder, whose lock the caller holds; returns the equivalence table."""
    for item in plan.checked[1:]:
        store_variant(item.variant)
    _write_variant_configs(plan.invocation_dir / VARIANTS_DIR / TRANSFORM_GROUP,
                           [item.variant for item in plan.checked[1:]])
    return write_variant_files(plan.invocation_dir, plan.checked, plan.not_applied)


def _settings(results: Sequence[JobResult]) -> List[str]:
    """Each job's setting: the overrides that vary across the sweep, besides the chain and the round."""
    per_job = [{override_key(o): o for o in r.overrides if override_key(o) not in ROW_KEYS_IGNORED} for r in results]
    varying = sorted(varying_keys(per_job))
    return [",".join(job[k] for k in varying if k in job) for job in per_job]


def _against(base: Mapping[int, Summary], others: Mapping[str, Mapping[int, Summary]],
             figure: Callable[[Summary], float]) -> Dict[str, str]:
    """Each variant's direction against the base chain on one figure, paired by round (none without
    the base's rounds)."""
    if not base:
        return {}
    picked = against_base({r: float(figure(s)) for r, s in base.items()},
                          {n: {r: float(figure(s)) for r, s in v.items()} for n, v in others.items()})
    return {n: direction for n, (_, direction) in picked.items()}


def explore_rows(invocation_dir: Path, plan: Plan) -> List[VariantRow]:
    """One row per variant and setting: medians over the rounds (samples/s, and the CPU a sample
    costs, which other load on a shared machine barely moves), ratios over the base chain, and
    whether each differs from the base for real (significance.against_base: paired by round,
    Holm over the setting's variants)."""
    results = load_job_results(invocation_dir)
    measured: Dict[Tuple[str, str], Dict[int, Summary]] = {}
    for result, setting in zip(results, _settings(results)):
        rounds = measured.setdefault((setting, result.key.transform), {})
        rounds[len(rounds) if result.round is None else result.round] = result.summary
    base = plan.checked[0].variant.name
    rows = []
    for setting in dict.fromkeys(setting for setting, _ in measured):
        base_rounds = measured.get((setting, base), {})
        others = {item.variant.name: measured[(setting, item.variant.name)] for item in plan.checked[1:]
                  if (setting, item.variant.name) in measured}
        rate_vs = _against(base_rounds, others, lambda s: s.samples_per_s)
        cpu_vs = _against(base_rounds, others, lambda s: s.cpu_ms_per_sample)
        base_rate = Summary.median(list(base_rounds.values()), "samples_per_s")
        base_cpu = Summary.median(list(base_rounds.values()), "cpu_ms_per_sample")
        for item in plan.checked:
            summaries = list(measured.get((setting, item.variant.name), {}).values())
            if not summaries:
                continue
            rates = [r.samples_per_s for r in summaries]
            cpus = [r.cpu_ms_per_sample for r in summaries]
            rate, cpu = statistics.median(rates), statistics.median(cpus)
            name = item.variant.name
            unpaired = BASE_VERDICT if name == base else "-"
            rows.append(VariantRow(
                variant=name, setting=setting or "-", verdict=item.verdict, rounds=len(summaries),
                samples_per_s=rate, samples_per_s_min=min(rates), samples_per_s_max=max(rates),
                speedup=rate / base_rate, rate_vs_base=rate_vs.get(name, unpaired),
                cpu_ms_per_sample=cpu, cpu_ms_min=min(cpus), cpu_ms_max=max(cpus),
                cpu_speedup=base_cpu / cpu, cpu_vs_base=cpu_vs.get(name, unpaired),
                samples_per_s_epoch=Summary.median(summaries, "samples_per_s_epoch"),
                batch_mb=Summary.median(summaries, "batch_mb_median"),
                ready_next_ms=Summary.median(summaries, "ready_next_ms_median")))
    return rows


def _resolved(best: VariantRow, reference: VariantRow, direction: str, word: str) -> str:
    """How sure the comparison with the base is, in words (significance's rule)."""
    if min(best.rounds, reference.rounds) < MIN_SAMPLES:
        return f"fewer than {MIN_SAMPLES} rounds a side, so not resolved"
    if direction == (UP if word == "faster than" else DOWN):
        return f"{word} the base in a paired test over the rounds, Holm-corrected over the variants"
    return f"within the round-to-round noise, so not resolved; rounds={RESOLVING_ROUNDS} can resolve it"


def conclusions(rows: Sequence[VariantRow], plan: Plan) -> List[str]:
    """Per setting, in plain words: the fastest equivalent chain and the one that costs the least CPU
    a sample, whether they differ from the base chain for real, and what to change to get them."""
    changes = {item.variant.name: item.variant.changes for item in plan.checked}
    base = plan.checked[0].variant.name
    lines = []
    for setting in dict.fromkeys(r.setting for r in rows):
        group = [r for r in rows if r.setting == setting]
        where = "" if setting == "-" else f" at {setting}"
        reference = next((r for r in group if r.variant == base), None)
        if reference is None:
            lines.append(f"{base} was not measured{where}: nothing to compare with")
            continue
        candidates = allowed(group)
        fastest = winner(group)
        leanest = min(candidates, key=lambda r: r.cpu_ms_per_sample)
        rate_cleared = fastest.rate_vs_base == UP
        if fastest is reference:
            lines.append(f"no equivalent variant ran faster than {base}{where}")
        else:
            lines.append(f"fastest equivalent chain{where}: {fastest.variant}, {fastest.speedup:.2f}x the "
                         f"samples/s of {base} (median of {fastest.rounds} interleaved rounds; "
                         f"{_resolved(fastest, reference, fastest.rate_vs_base, 'faster than')}); to get it: "
                         + "; ".join(changes[fastest.variant]))
        if leanest is not reference and (leanest is not fastest or not rate_cleared):
            lines.append(f"least CPU a sample{where}: {leanest.variant}, {leanest.cpu_ms_per_sample:.3g} ms "
                         f"against {reference.cpu_ms_per_sample:.3g} ms for {base} ({leanest.cpu_speedup:.2f}x "
                         f"less; {_resolved(leanest, reference, leanest.cpu_vs_base, 'below')}); to get it: "
                         + "; ".join(changes[leanest.variant]))
        lines += [f"{r.variant} ran faster still ({r.speedup:.2f}x) but is {r.verdict}"
                  for r in group if r not in candidates and r.samples_per_s > fastest.samples_per_s]
    return lines


def what_to_do(invocation_dir: Path, rows: Sequence[VariantRow], plan: Plan) -> str:
    """Per setting: the winner, its waterfall from the base chain (waterfall.md / .csv) and the
    winning chain as a transform config (winner/transform/<chain>_winner.yaml); then the moves that
    were not tried for want of a library, with one pip line for them all. Returns the markdown."""
    variants = [item.variant for item in plan.checked]
    base = plan.checked[0].variant.name
    parts, table_rows = [], []
    for setting in dict.fromkeys(r.setting for r in rows):
        group = [r for r in rows if r.setting == setting]
        best = winner(group)
        if best is None or best.variant == base:
            continue
        steps = waterfall(group, variants, best)
        written = [dataclasses.asdict(step) for step in steps]
        table_rows += [{"setting": setting, **step} for step in written]
        chosen = next(v for v in variants if v.name == best.variant)
        name = f"{_folder_safe(base)}_winner" + ("" if setting == "-" else f"_{_folder_safe(str(setting))}")
        path = invocation_dir / WINNER_DIR / TRANSFORM_GROUP / f"{name}.yaml"
        _write_variant_configs(path.parent, [dataclasses.replace(chosen, name=name)])
        loader = "".join(f" loader.{k}={v}" for k, v in chosen.loader)
        where = "" if setting == "-" else f" at {setting}"
        parts.append(f"what to do{where}, in order (winner {chosen.name}, {best.verdict}, "
                     f"{best.speedup:.2f}x the samples/s and {best.cpu_speedup:.2f}x less CPU a sample):\n"
                     + "".join(f"{k}. {step.edit} ({step.step_gain:.2f}x on the way; alone "
                               f"{step.alone_speedup:.2f}x)\n" for k, step in enumerate(steps[1:], start=1))
                     + f"ready to use: `pipebench run --config-dir {shlex.quote(str(path.parent.parent))} "
                       f"transform={name}{loader}` (or copy {path} into your own config folder's transform/)\n\n"
                     + markdown_table(written, WATERFALL_COLUMNS))
    if table_rows:
        write_text_atomic(invocation_dir / WATERFALL_CSV, csv_text(table_rows, list(table_rows[0])))
    markdown = "\n".join(parts) or "no equivalent variant ran faster than the chain: nothing to change\n"
    if plan.missing:  # said mid-output among the not-applied lines too, where it is easily missed
        markdown += f"\nnot tried here, for want of a library: {missing_line(plan.missing)} (then explore again)\n"
    write_text_atomic(invocation_dir / WATERFALL_MD, markdown)
    return markdown


def write_explore_table(invocation_dir: Path, plan: Plan) -> str:
    """explore.csv and explore.md (the table, its conclusions and what to do); returns the markdown."""
    measured = explore_rows(invocation_dir, plan)
    if not measured:
        return "(no variant was measured)\n"
    rows = [dataclasses.asdict(row) for row in measured]
    markdown = markdown_table(rows, EXPLORE_COLUMNS) + "\n" + "\n".join(conclusions(measured, plan)) + "\n\n" \
        + what_to_do(invocation_dir, measured, plan)
    write_text_atomic(invocation_dir / EXPLORE_CSV, csv_text(rows, list(rows[0])))
    write_text_atomic(invocation_dir / EXPLORE_MD, markdown)
    return markdown
