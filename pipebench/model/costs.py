"""The cost model: samples/s and starvation predicted from one chain's single-process costs.

The model is the one an engineer does on a napkin. A chain takes ``c`` ms a sample of wall
time and ``c_cpu`` ms of CPU time (measured at workers=0, where nothing competes; they differ
by the I/O waits), the consumer takes ``s`` ms a step of B samples, and the machine has C
usable cores:

- workers=0: the main process does both in turn, so a step is B·c + s;
- W workers: each worker makes at most 1/c samples a ms, all of them together at most
  C / (c_cpu + s_cpu/B), the cores' budget once the consumer's own CPU share s_cpu is paid
  (zero for a consumer that sleeps or runs on a GPU), and the consumer eats at most B/s.
  Throughput is the least of the three; starvation is 1 − throughput / consumer rate.
- R ranks (distributed.nproc): each rank has its own loader and consumer, so the per-rank
  limits multiply by R, while the cores' budget is shared by all of them.

W/c assumes W worker processes (pipebench.report.diagnosis leaves thread-backend rows unpredicted).
Pure arithmetic: the report reads the costs from results (`chain_costs`), tune from its probes.
"""

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from pipebench.base.tables import format_value


@dataclass(frozen=True)
class ChainCosts:
    """What the model needs of one chain, measured at workers=0 unless `source` says otherwise."""

    ms_per_sample: float
    cpu_ms_per_sample: float
    consumer_ms: float
    consumer_cpu_ms: float
    batch_size: int
    usable_cores: int
    source: str


@dataclass(frozen=True)
class Prediction:
    samples_per_s: float
    starvation_pct: float
    bound: str  # "serial", "consumer", "workers" or "cores": which limit sets the rate


def _rate(amount: float, cost_ms: float) -> float:
    """amount / cost_ms in samples a ms; a cost too small to time limits nothing."""
    return amount / cost_ms if cost_ms > 0 else math.inf


def predict(costs: ChainCosts, workers: int, ranks: int = 1, busy: Optional[int] = None) -> Prediction:
    """Samples/s (all ranks together) and starvation % of `costs` with `workers` DataLoader workers
    in each of `ranks` ranks (see the module doc). `busy`: the readers (workers, or ranks at workers=0)
    that get data at all, where a sharded set leaves some none; only they read, so only they count."""
    batch, c, s = costs.batch_size, costs.ms_per_sample, costs.consumer_ms
    readers = ranks * max(workers, 1) if busy is None else busy
    consumer = _rate(ranks * batch, s)
    limits = {"serial": _rate(readers * batch, batch * c + s)} if workers == 0 else {
        "consumer": consumer,
        "workers": _rate(readers, c),
    }
    limits["cores"] = _rate(costs.usable_cores, costs.cpu_ms_per_sample + costs.consumer_cpu_ms / batch)
    bound = min(limits, key=limits.get)
    rate = limits[bound]  # samples a ms
    starvation = 100.0 * (1.0 - rate / consumer) if s > 0 else 100.0
    return Prediction(1000.0 * rate, max(starvation, 0.0), bound)


def workers_to_feed(costs: ChainCosts) -> Optional[int]:
    """The fewest workers whose output matches the consumer's appetite, or None if the cores can't."""
    if costs.consumer_ms <= 0:
        return None
    needed = math.ceil(costs.ms_per_sample * costs.batch_size / costs.consumer_ms)
    return needed if predict(costs, needed).bound == "consumer" else None


@dataclass(frozen=True)
class TargetNeeds:
    """What one chain needs for the consumer to be busy `target_pct` of the time: workers, usable
    cores, and whether this host has the cores. `workers`/`cores` None: no consumer time to fill."""

    target_pct: float
    workers: Optional[int]
    cores: Optional[int]
    host_cores: int
    # A sharded dataset with fewer shards than the workers needed: its shard count (the most workers
    # that get data, as the idle-readers line says) and the consumer's busy % they reach. None otherwise.
    shards: Optional[int] = None
    busy_pct_at_shards: Optional[float] = None

    @property
    def host_has_them(self) -> bool:
        return self.cores is not None and self.cores <= self.host_cores


def needs_for_target(costs: ChainCosts, target_pct: float, shards: Optional[int] = None) -> TargetNeeds:
    """Workers and cores for accel_util_pct >= `target_pct`, by the same model as `predict`.

    The consumer is busy rate / (B/s) of the time, so the loader must deliver u·B/s samples a
    ms (u = target_pct / 100): W workers make W/c, so W = ⌈u·B·c/s⌉; the cores spend
    c_cpu + s_cpu/B ms of CPU a sample, so C = ⌈u·(B·c_cpu + s_cpu)/s⌉. When workers=0 already
    reaches the target (B·c + s ≤ s/u), no worker is needed, and one core does it. A sharded set of
    `shards` shards feeds no more than that many workers: where W is more, the needs say so, with the
    busy % its shards' readers reach by `predict`, the model the idle-readers line uses.
    """
    batch, c, s = costs.batch_size, costs.ms_per_sample, costs.consumer_ms
    if not s > 0:
        return TargetNeeds(target_pct, None, None, costs.usable_cores)
    share = target_pct / 100.0
    if batch * c + s <= s / share:
        return TargetNeeds(target_pct, 0, 1, costs.usable_cores)
    workers = max(math.ceil(share * batch * c / s), 1)
    cores = max(math.ceil(share * (batch * costs.cpu_ms_per_sample + costs.consumer_cpu_ms) / s), 1)
    needs = TargetNeeds(target_pct, workers, cores, costs.usable_cores)
    if shards is None or workers <= shards:
        return needs
    reached = 100.0 - predict(costs, shards, busy=shards).starvation_pct
    return dataclasses.replace(needs, shards=shards, busy_pct_at_shards=reached)


def target_line(chain: str, needs: TargetNeeds) -> str:
    """One line: what `chain` needs to keep the consumer busy `target_pct` of the time, and whether this host has it."""
    if needs.workers is None:
        return f"{chain}: no consumer time was measured, so no accel_util_pct target applies."
    if needs.workers == 0:
        return f"{chain}: workers=0 already keeps the consumer {format_value(needs.target_pct)}% busy; any host does."
    if needs.shards is not None:
        return (f"{chain}: {needs.workers} reading worker(s) would keep the consumer {format_value(needs.target_pct)}% "
                f"busy, but its {needs.shards} shard(s) give data to {needs.shards} worker(s) at most, which keep it "
                f"about {format_value(needs.busy_pct_at_shards)}% busy (workers={needs.shards}); write at least "
                f"{needs.workers} shards (`pipebench dataset convert --shard-size N`) to reach the target.")
    have = (f"this host has them ({needs.host_cores} usable)" if needs.host_has_them else
            f"this host has {needs.host_cores} usable, {needs.cores - needs.host_cores} short: more cores, or a "
            "cheaper chain (`pipebench explore`)")
    return (f"{chain}: {needs.workers} worker(s) and {needs.cores} usable core(s) keep the consumer "
            f"{format_value(needs.target_pct)}% busy; {have}.")
