"""The chains a tune probes and which of them race: the user's chain and explore's equivalent
variants, then explore's winners at workers=0 among them."""

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from pipebench.base.typed_json import parse
from pipebench.explore.equivalence import is_equivalent
from pipebench.explore.plan import NoVariants, check_variants, store_variant
from pipebench.record.jobs import JobResult
from pipebench.tune.objective import probe_ties, race_rates
from pipebench.tune.plan import TuneOptions, store_chain
from pipebench.tune.recommend import STRICTNESS, strictness

__all__ = ["PROBE_FAILED", "ChainSet", "probed_chains", "winning_chains"]

# Why a chain has no probe result: its job ended without one (a crash, a signal; its line is above).
PROBE_FAILED = "its probe job ended without a result; its line is above"


@dataclass(frozen=True)
class ChainSet:
    """The chains tune probes: the user's first, then explore's equivalent variants; each variant's
    config, and each chain's equivalence verdict against the user's and its moves."""

    names: Tuple[str, ...]
    configs: Mapping[str, Mapping[str, object]]
    verdicts: Mapping[str, str]
    moves: Mapping[str, Tuple[str, ...]]

    def record(self) -> Dict[str, object]:
        """As tune.json keeps it, for a resumed tune."""
        return {name: {"config": self.configs.get(name), "verdict": self.verdicts.get(name, STRICTNESS[0]),
                       "moves": list(self.moves.get(name, ()))} for name in self.names}

    @classmethod
    def read(cls, recorded: Mapping[str, Mapping[str, object]]) -> "ChainSet":
        """From tune.json, each variant stored again as `transform=<name>` (explore's checks not rerun)."""
        chains = {name: parse(_RecordedChain, item) for name, item in recorded.items()}
        configs = {name: dict(chain.config) for name, chain in chains.items() if chain.config is not None}
        for name, config in configs.items():
            store_chain(name, config)
        return cls(tuple(chains), configs, {n: str(chain.verdict) for n, chain in chains.items()},
                   {n: tuple(chain.moves or ()) for n, chain in chains.items()})


@dataclass(frozen=True)
class _RecordedChain:
    """One chain as tune.json keeps it (ChainSet.record)."""

    verdict: str
    config: Optional[Mapping[str, object]] = None
    moves: Optional[Tuple[str, ...]] = None


def probed_chains(first_job: Sequence[str], options: TuneOptions, base: str) -> ChainSet:
    """The user's chain and explore's equivalent variants this host can measure, each variant stored
    as a transform config (not the user's own: stored again, Hydra warns of a schema over its file)."""
    mine = ChainSet((base,), {}, {base: STRICTNESS[0]}, {base: ()})
    if not options.variants:
        return mine
    found = check_variants(first_job, loader_moves=False)
    if isinstance(found, NoVariants):
        print(f"tune: no variants of transform={base}: {'; '.join(found.reasons)}")
        return mine
    names, configs, verdicts, moves = [], {}, {}, {}
    for item in found.checked:
        if item.measured and (item.equivalence is None or is_equivalent(item.verdict)):
            name = item.variant.name
            names.append(name)
            verdicts[name], moves[name] = item.verdict, tuple(item.variant.moves)
            if item.equivalence is not None:
                store_variant(item.variant)
                configs[name] = item.variant.chain.as_config()
    return ChainSet(tuple(names), configs, verdicts, moves)


def winning_chains(probe: Mapping[str, List[JobResult]], chains: ChainSet, most: int
                   ) -> Tuple[List[str], Dict[str, str]]:
    """Explore's winners at workers=0: the chains the probe cannot tell apart from its fastest, the
    `most` of them with the strictest equivalence to the user's chain, then the fastest; what became
    of each chain, in words."""
    summaries = {c: [r.summary for r in probe[c]] for c in chains.names if probe.get(c)}
    verdicts = {c: f"crashed: {PROBE_FAILED}" for c in chains.names if c not in summaries}
    if not summaries:
        return [], verdicts
    rate = {c: race_rates(s)[0] for c, s in summaries.items()}
    fastest = max(summaries, key=rate.get)
    near = sorted(probe_ties(summaries, fastest),
                  key=lambda c: (strictness(chains.verdicts.get(c, STRICTNESS[0])), -rate[c]))
    for chain in summaries:
        if chain in near[:most]:
            verdicts[chain] = f"kept: {rate[chain]:.4g} samples/s at workers=0"
        elif chain in near:
            verdicts[chain] = (f"dropped: the probe cannot tell it from {fastest}, but tune.max_chains={most} keeps "
                               f"{most}, the strictest equivalents first ({rate[chain]:.4g} samples/s, "
                               f"{chains.verdicts.get(chain, '')})")
        else:
            verdicts[chain] = (f"dropped: told apart from the fastest chain, {fastest} ({rate[chain]:.4g} against "
                               f"{rate[fastest]:.4g} samples/s at workers=0)")
    return near[:most], verdicts
