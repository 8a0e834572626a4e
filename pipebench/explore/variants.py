"""Generate a chain's variants from what its transforms declare (pipebench.pipeline.movement).

Each move is legal only where the declarations say so; docs/explore.md says what each does. The
stacked moves (STACKED) build up one at a time; the tails (TAILS) are alternative homes for the
chain's tail; gpu_decoder and gpu_region_decode replace both the decode and the tail, so they stack
only on the moves that touch neither. The four decode moves replace the same decode, so in the stack
the first that applies takes it. The variants form a ladder from the base chain to the most-moved
one (`_ladder`), so explore can show what each edit is worth alone and on the way to the winner; a
chain equal to an earlier variant is dropped.
"""

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from pipebench.base.extras import MissingExtra, installed
from pipebench.config.limits import MAX_PREFETCH_FACTOR
from pipebench.explore.chain import (
    CROP_FIRST,
    DECODER,
    FAST,
    GPU_DECODER,
    GPU_REGION_DECODE,
    LATE_CAST,
    MOVES,
    NAME_SEPARATOR,
    PER_BATCH,
    REDUCED_DECODE,
    REGION_DECODE,
    STACKED,
    STACKED_UNDER_GPU_DECODER,
    TAILS,
    TENSOR_PATH,
    TO_DEVICE,
    Chain,
    Exploration,
    Moved,
    SampleSource,
    Variant,
)
from pipebench.explore.chain_moves import crop_first, fast, late_cast, per_batch, to_device
from pipebench.explore.decode_moves import (
    decoder,
    gpu_decoder,
    gpu_region_decode,
    reduced_decode,
    region_decode,
    tensor_path,
)
from pipebench.pipeline.consumers import HOST_DEVICE
from pipebench.pipeline.loader_backends import BACKENDS, PROCESSES
from pipebench.transforms import region_codec
from pipebench.transforms.region_codec import region_decode_problem

# Loader moves: one loader setting each, on top of the most-moved chain a host can run.
# persistent_workers pays through the epoch restart (samples_per_s_epoch), the others through
# delivery: more batches queued, pinned memory for the copy, another way to share tensors; the
# backend through what runs the chain (threads or processes).
PERSISTENT_WORKERS = "persistent_workers"
PREFETCH_FACTOR = "prefetch_factor"
PIN_MEMORY = "pin_memory"
SHARING_STRATEGY = "sharing_strategy"
BACKEND = "backend"
LOADER_MOVES = (PERSISTENT_WORKERS, PREFETCH_FACTOR, PIN_MEMORY, SHARING_STRATEGY, BACKEND)
# One line a loader move for `pipebench explore --help`, held to LOADER_MOVES by a test.
LOADER_MOVE_HELP = {
    PERSISTENT_WORKERS: "workers kept across epochs (no restart at each epoch end)",
    PREFETCH_FACTOR: "twice the batches each worker keeps ready",
    PIN_MEMORY: "batches in page-locked memory for the copy (with CUDA only)",
    SHARING_STRATEGY: "tensors shared through files instead of file descriptors (file_system)",
    BACKEND: "each other installed loader.backend (dataloader, threads, spdl) at the same workers, one variant "
             "each (map-style datasets)",
}
FILE_SYSTEM = "file_system"
# Settings only worker processes read: under a thread backend they change nothing.
PROCESS_SETTINGS = (PERSISTENT_WORKERS, SHARING_STRATEGY)


def move_functions(source: Optional[SampleSource], device: str = HOST_DEVICE, region_problem: str = "",
                   device_region_problem: str = "") -> Mapping[str, Callable[[Chain], Moved]]:
    """Each move's function, with the decode moves told what the dataset gives, gpu_decoder where the
    on_device steps run (the consumer's device, or the host CPU), region_decode why nvImageCodec
    cannot run here ("" when it can), and gpu_region_decode why it cannot run on `device`."""
    return {REDUCED_DECODE: functools.partial(reduced_decode, source=source),
            REGION_DECODE: functools.partial(region_decode, source=source, unavailable=region_problem),
            TENSOR_PATH: functools.partial(tensor_path, source=source), DECODER: decoder, CROP_FIRST: crop_first,
            FAST: fast, PER_BATCH: per_batch, LATE_CAST: late_cast, TO_DEVICE: to_device,
            GPU_DECODER: functools.partial(gpu_decoder, source=source, device=device),
            GPU_REGION_DECODE: functools.partial(gpu_region_decode, source=source, device=device,
                                                 unavailable=region_problem or device_region_problem)}


def _apply(chain: Chain, moves: Sequence[str], functions: Mapping[str, Callable[[Chain], Moved]]
           ) -> Optional[Moved]:
    """Apply moves in order; None when one of them changes nothing (that combination adds nothing)."""
    changes: List[str] = []
    draws: List[str] = []
    for move in moves:
        done = functions[move](chain)
        if not done.changes:
            return None
        chain = done.chain
        changes += done.changes
        draws += done.draws_per_batch
    return Moved(chain, tuple(changes), draws_per_batch=tuple(draws))


def _ladder(chain: Chain, functions: Mapping[str, Callable[[Chain], Moved]]) -> List[Tuple[str, ...]]:
    """The move lists to try: each move alone, the stack built up one move at a time, the full
    stack with each tail, gpu_decoder on the stack of the moves it leaves alone."""
    stack = _stack(chain, functions, STACKED)
    singles = [(move,) for move in MOVES]
    built = [tuple(stack[:k]) for k in range(2, len(stack) + 1)]
    # A region decode leads the stack where it applies, but it can cost more than a whole decode
    # (the box of Resize+CenterCrop is half the image, and every row above the box is read): the
    # full stack without it is measured beside it, so the ladder's best is not bound to it.
    if stack[:1] == [REGION_DECODE]:
        without = _stack(chain, functions, tuple(m for m in STACKED if m != REGION_DECODE))
        built += [tuple(without)] if len(without) > 1 else []
    tails = [(*stack, tail) for tail in TAILS] if stack else []
    under_gpu = _stack(chain, functions, STACKED_UNDER_GPU_DECODER)
    on_gpu = [(*under_gpu, move) for move in (GPU_DECODER, GPU_REGION_DECODE)] if under_gpu else []
    return [*singles, *built, *tails, *on_gpu]


def _stack(chain: Chain, functions: Mapping[str, Callable[[Chain], Moved]], moves: Sequence[str]) -> List[str]:
    """The moves of `moves` that change the chain when applied in order, each on the last's result."""
    stack: List[str] = []
    for move in moves:
        done = functions[move](chain)
        if done.changes:
            stack.append(move)
            chain = done.chain
    return stack


@dataclass(frozen=True)
class LoaderSetting:
    """What loader moves look at: the job's workers, its loader settings, whether CUDA is here, and
    each backend other than the job's with why it cannot run the job ("" where it can: its library
    is installed and it can read the dataset); `missing_backends`: those of them that lack only their
    library."""

    workers: int
    values: Mapping[str, Any]
    cuda: bool
    other_backends: Mapping[str, str] = field(default_factory=dict)
    missing_backends: Tuple[MissingExtra, ...] = ()


@dataclass(frozen=True)
class LoaderChange:
    """One variant a loader move makes: its name among the variant's moves, and the value it sets
    `loader.<key>` to. A move makes one, or one per value it tries (`backend`), each named apart,
    so every variant's moves are its own (the waterfall finds a variant by them)."""

    label: str
    key: str
    value: Any


def _loader_change(move: str, setting: LoaderSetting) -> Tuple[Optional[Any], str]:
    """(the new value of loader.<move>, "") or (None, why the move does not apply)."""
    current = setting.values[move]
    if move == PIN_MEMORY:
        if not setting.cuda:
            return None, "pin_memory: no CUDA device here, so pinning does nothing"
        return (True, "") if not current else (None, "pin_memory: already on")
    if setting.workers == 0:
        return None, f"{move}: the loader has no workers (workers=0), so the setting does nothing"
    backend = setting.values[BACKEND]
    if move in PROCESS_SETTINGS and BACKENDS[backend].worker_kind != PROCESSES:
        return None, f"{move}: loader.backend={backend} runs threads, and the setting is for worker processes"
    if move == PERSISTENT_WORKERS:
        return (True, "") if not current else (None, "persistent_workers: already on")
    if move == PREFETCH_FACTOR:
        doubled = min(2 * int(current), MAX_PREFETCH_FACTOR)
        return (doubled, "") if doubled != current else (None, "prefetch_factor: already at its largest")
    return (FILE_SYSTEM, "") if current != FILE_SYSTEM else (None, "sharing_strategy: already file_system")


def loader_changes(move: str, setting: LoaderSetting) -> Tuple[List[LoaderChange], List[str]]:
    """The variants loader move `move` makes here (`backend`: one per other backend that can run the
    job), and why it makes no (other) one."""
    if move == BACKEND and setting.workers == 0:
        return [], [f"{BACKEND}: the loader has no workers (workers=0), so every backend is the same in-process loop"]
    if move == BACKEND:
        others = setting.other_backends
        return ([LoaderChange(f"{BACKEND}_{name}", BACKEND, name) for name, why in others.items() if not why],
                [f"{BACKEND}: {why}" for why in others.values() if why])
    value, why = _loader_change(move, setting)
    return ([LoaderChange(move, move, value)], []) if value is not None else ([], [why])


def loader_variants(parent: Variant, setting: LoaderSetting) -> Tuple[List[Variant], List[str]]:
    """`parent`'s chain with one loader setting changed, per loader move and value that can change
    the result here; and why each other loader move (or value) does not apply."""
    variants, reasons = [], []
    for move in LOADER_MOVES:
        changes, why = loader_changes(move, setting)
        reasons += why
        for change in changes:
            variants.append(Variant(NAME_SEPARATOR.join((parent.name, change.label)), (*parent.moves, change.label),
                                    (*parent.changes, f"set loader.{change.key}={json.dumps(change.value)}"),
                                    parent.chain, parent.draws_per_batch, ((change.key, change.value),)))
    return variants, reasons


def loader_parent(variants: Sequence[Variant]) -> Variant:
    """The chain loader moves build on: the most-moved variant a host without a device can run
    (the stack with the late cast, when there is one)."""
    host = [v for v in variants if not v.needs_device and not v.loader]
    return max(host, key=lambda v: (len(v.moves), LATE_CAST in v.moves))


def explore(name: str, chain: Chain, setting: Optional[LoaderSetting] = None,
            source: Optional[SampleSource] = None, device: str = HOST_DEVICE,
            region_problem: Optional[str] = None) -> Exploration:
    """The base chain and every distinct variant of the ladder (see the module docstring); with a
    `setting`, also the loader moves on top of the most-moved host chain. `source` (the dataset's
    first sample) lets the decode moves skip a dataset they cannot serve; `device` is where the
    on_device steps will run (gpu_decoder names it); `region_problem` why the region decode cannot run
    here (None: ask nvImageCodec now, and on a device, whether its GPU backend runs there)."""
    device_region_problem = ""
    if region_problem is None:
        region_problem = region_decode_problem()
        if device != HOST_DEVICE and not region_problem:  # nvJPEG is a wheel of its own
            device_region_problem = region_decode_problem(device)
    functions = move_functions(source, device, region_problem, device_region_problem)
    variants = [Variant(name, (), (), chain)]
    seen = {variants[0].key()}
    for moves in _ladder(chain, functions):
        done = _apply(chain, moves, functions)
        if done is None:
            continue
        variant = Variant(NAME_SEPARATOR.join((name, *moves)), moves, done.changes, done.chain, done.draws_per_batch)
        if variant.key() not in seen:
            seen.add(variant.key())
            variants.append(variant)
    not_applied = [done.reason for done in (functions[m](chain) for m in MOVES) if not done.changes]
    if setting is not None:
        on_loader, reasons = loader_variants(loader_parent(variants), setting)
        variants += on_loader
        not_applied += reasons
    return Exploration(tuple(variants), tuple(not_applied), missing_libraries(chain, source, device, region_problem,
                                                                               setting))


def missing_libraries(chain: Chain, source: Optional[SampleSource], device: str, region_problem: str,
                      setting: Optional[LoaderSetting]) -> Tuple[MissingExtra, ...]:
    """The moves that would apply here but for a library that is not installed: the region decodes
    without nvImageCodec (each move tried as if it were installed), and each other backend that lacks
    only its library where the backend move applies (the loader has workers)."""
    missing: List[MissingExtra] = []
    if region_problem and not installed(region_codec.MODULE):
        as_installed = move_functions(source, device)
        missing += [MissingExtra(move, region_codec.LIBRARY, region_codec.EXTRA)
                    for move in (REGION_DECODE, GPU_REGION_DECODE) if as_installed[move](chain).changes]
    if setting is not None and setting.workers > 0:
        missing += setting.missing_backends
    return tuple(missing)


def ladder_of(variant: Variant, variants: Sequence[Variant]) -> List[Variant]:
    """The variants whose moves are the prefixes of `variant`'s, shortest first, ending with it:
    the steps of the waterfall from the base chain (moves ()) to it."""
    by_moves = {v.moves: v for v in variants}
    return [by_moves[variant.moves[:k]] for k in range(len(variant.moves) + 1) if variant.moves[:k] in by_moves]

