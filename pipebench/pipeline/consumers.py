"""What eats the batches in the step loop: nothing, an emulated accelerator, or the seed's CNN.

Every consumer follows one small interface (`Consumer` below):

- ``device: Optional[torch.device]`` -- where the step loop copies each batch before calling
  ``step`` (its host-to-device copy is timed apart from the step). ``None`` leaves the batch on
  the host. ``none`` -> None; ``emulated`` -> cuda when CUDA is present (it stands in for an
  accelerator, so on a GPU machine the real copy is paid), else None; ``toy_cnn`` -> the device
  it trains on.
- ``step(data, labels) -> None`` -- one training step. It returns only when the step's work is
  done, so a host timer around it measures the work and not the launch (CUDA consumers
  synchronise before returning), unless told to ``run_ahead()``.
- ``run_ahead() -> None`` -- only consumers that can: from now on ``step`` queues its work and
  returns without waiting (run.sync=async; pipebench.measure.repeats).
- ``report() -> dict`` -- JSON-able figures gathered over the steps, for result.json.

Consumers are built with ``build_consumer(spec, seed)``. Construction never touches CUDA beyond
asking whether it exists: DataLoader workers may be forked after it, and a forked child cannot use
its parent's CUDA context, so the context is made on the first step. Every class is importable at
module level and picklable until its first step, so nothing here breaks under spawn.
"""

import statistics
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Protocol, Sequence, runtime_checkable

import numpy as np
import torch
from torch import nn

from pipebench.base.errors import ConfigError
from pipebench.base.gpu_timing import NS_PER_MS, CudaPhaseTimer, HostPhaseTimer, UntimedPhases
from pipebench.config.specs import EMULATED, NO_CONSUMER, ConsumerSpec
from pipebench.pipeline.masked_loss import MASKED_LOSSES

NS_PER_S = 1_000_000_000
# Mixed into the run seed so the emulated step times are their own random stream: a change to
# how the dataset or transforms draw from `seed` never shifts the consumer's draws, and back.
EMULATED_STREAM_ID = 0x5EED_C0DE
# time.sleep oversleeps by 50-100 us on Linux. The emulated consumer asks for that much less,
# learning the slop as it goes; one slow wake-up on a busy machine (milliseconds) must not
# teach it to undersleep, so a single observation counts for at most this much.
MAX_SLOP_SAMPLE_S = 0.0005
# Weight of the newest observation in the running slop estimate: smooth over ~20 steps.
SLOP_EWMA_WEIGHT = 0.05
# The seed article's CNN (docs/configs.md, consumer=toy_cnn): RGB in, 30 channels wide, 10 classes out.
TOY_CNN_IN_CHANNELS = 3
TOY_CNN_WIDTH = 30
TOY_CNN_CLASSES = 10
TOY_CNN_KERNEL = 3
# Phases each toy_cnn step is timed in; `input` is the copy/convert of the batch on the device.
TOY_CNN_PHASES = ("input", "forward", "backward", "optimizer")


@runtime_checkable
class Consumer(Protocol):
    """The interface the step loop relies on; see the module docstring."""

    device: Optional[torch.device]

    def step(self, data: Any, labels: Any) -> None: ...

    def report(self) -> Dict[str, Any]: ...


def _summary_ms(values: Sequence[float]) -> Dict[str, Any]:
    """mean/median/std/min/max of a list of milliseconds (JSON-able; empty list -> n=0 only)."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "std": statistics.pstdev(values),
        "min": min(values),
        "max": max(values),
    }


class NoConsumer:
    """Pure loader throughput: the step is the wait for data."""

    device: Optional[torch.device] = None

    def step(self, data: Any, labels: Any) -> None:
        return None

    def report(self) -> Dict[str, Any]:
        return {"kind": NO_CONSUMER}


@dataclass(frozen=True)
class StepTimeDistribution:
    """Per-step time of the emulated accelerator, in ms.

    fixed: always `step_ms`; normal: N(step_ms, spread_ms) clipped at 0; uniform:
    U(step_ms - spread_ms, step_ms + spread_ms) clipped at 0.
    """

    kind: str
    step_ms: float
    spread_ms: float = 0.0

    def draw_ms(self, rng: np.random.Generator, size: Optional[int] = None) -> Any:
        """One draw (float) or `size` draws (ndarray) from `rng`; never touches the global RNGs."""
        if self.kind == "fixed":
            drawn = np.full(size, self.step_ms) if size is not None else self.step_ms
        elif self.kind == "normal":
            drawn = rng.normal(self.step_ms, self.spread_ms, size)
        elif self.kind == "uniform":
            drawn = rng.uniform(self.step_ms - self.spread_ms, self.step_ms + self.spread_ms, size)
        else:
            raise ConfigError(f"consumer.distribution must be fixed, normal or uniform, got {self.kind!r}")
        clipped = np.maximum(drawn, 0.0)
        return float(clipped) if size is None else clipped


class EmulatedConsumer:
    """Sleeps a drawn time per step, the MLPerf Storage/DLIO way of standing in for an accelerator.

    It sleeps rather than spins, so it takes no CPU from the DataLoader workers, as a real
    accelerator would not. Draws come from its own generator seeded from the run seed, so a run
    is reproducible and the global numpy/torch RNGs are left alone.
    """

    def __init__(self, distribution: StepTimeDistribution, seed: int) -> None:
        self.distribution = distribution
        # cuda when present, else None; is_available() creates no CUDA context.
        self.device = torch.device("cuda") if torch.cuda.is_available() else None
        self._rng = np.random.default_rng([seed, EMULATED_STREAM_ID])
        self._slop_s = 0.0
        self._drawn_ms: List[float] = []
        self._slept_ms: List[float] = []

    def next_step_ms(self) -> float:
        """Draw the next step's time (advances this consumer's own stream)."""
        return self.distribution.draw_ms(self._rng)

    def step(self, data: Any, labels: Any) -> None:
        target_ms = self.next_step_ms()
        start = time.perf_counter_ns()
        if target_ms > 0:
            request_s = max(target_ms / 1000.0 - self._slop_s, 0.0)
            time.sleep(request_s)
            slept_s = (time.perf_counter_ns() - start) / NS_PER_S
            observed = min(max(slept_s - request_s, 0.0), MAX_SLOP_SAMPLE_S)
            self._slop_s += SLOP_EWMA_WEIGHT * (observed - self._slop_s)
        self._drawn_ms.append(target_ms)
        self._slept_ms.append((time.perf_counter_ns() - start) / NS_PER_MS)

    def report(self) -> Dict[str, Any]:
        """The drawn and the actually slept step times; their gap is the sleep's error."""
        return {
            "kind": EMULATED,
            "distribution": self.distribution.kind,
            "step_ms": self.distribution.step_ms,
            "spread_ms": self.distribution.spread_ms,
            "device": str(self.device) if self.device is not None else None,
            "drawn_ms": _summary_ms(self._drawn_ms),
            "slept_ms": _summary_ms(self._slept_ms),
        }


class ToyCnnInputError(ConfigError, ValueError):
    """The batch's images cannot feed the toy CNN (not 3-channel, square, power-of-two sized)."""


def toy_cnn_blocks(height: int, width: int) -> int:
    """Number of conv+ReLU+pool blocks that take a `height` x `width` image down to 1x1."""
    if height != width or height < 1 or height & (height - 1):
        raise ToyCnnInputError(
            f"toy_cnn needs square images whose side is a power of two (e.g. 256x256, as the seed "
            f"crops them), got {height}x{width}; change the crop or the dataset shape"
        )
    return height.bit_length() - 1


def _conv(in_channels: int, out_channels: int) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, TOY_CNN_KERNEL, padding=TOY_CNN_KERNEL // 2)


class ToyCNN(nn.Module):
    """The seed article's CNN: conv_in 3->30, then log2(input_size) blocks of conv 30->30 + ReLU +
    MaxPool2d(2) (to 1x1), then conv_out 30->10, flattened to [B, 10]. 256x256 input: 8 blocks."""

    def __init__(self, input_size: int = 256) -> None:
        super().__init__()
        self.input_size = input_size
        self.conv_in = _conv(TOY_CNN_IN_CHANNELS, TOY_CNN_WIDTH)
        self.blocks = nn.Sequential(*(
            nn.Sequential(_conv(TOY_CNN_WIDTH, TOY_CNN_WIDTH), nn.ReLU(), nn.MaxPool2d(2))
            for _ in range(toy_cnn_blocks(input_size, input_size))
        ))
        self.conv_out = _conv(TOY_CNN_WIDTH, TOY_CNN_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != TOY_CNN_IN_CHANNELS or tuple(x.shape[-2:]) != (self.input_size,) * 2:
            raise ToyCnnInputError(
                f"ToyCNN({self.input_size}) expects [B, {TOY_CNN_IN_CHANNELS}, {self.input_size}, "
                f"{self.input_size}], got {list(x.shape)}"
            )
        return torch.flatten(self.conv_out(self.blocks(self.conv_in(x))), 1)


def _resolve_device(requested: str) -> torch.device:
    """auto -> cuda when present, else cpu. Asks only is_available(): no CUDA context is made."""
    if requested == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if requested == "cuda":
        raise ConfigError("consumer.device=cuda but CUDA is not available here; use auto or cpu")
    return torch.device("cpu")


class ToyCnnConsumer:
    """Trains the seed's CNN for real: CrossEntropyLoss (or, for a `kind` of masked_loss.MASKED_LOSSES,
    the seed's masked, class-balanced loss, with or without host-device syncs) and SGD(lr, momentum).

    The model is built on the first batch, when the input size is known, and only then is CUDA
    touched. Weights are drawn from `seed` without disturbing the global torch RNG. Batches may
    come as uint8 (scaled by 1/255) or float; they are converted to float32 on the device.
    """

    def __init__(self, spec: ConsumerSpec, seed: int) -> None:
        self.kind = spec.kind
        self.device = _resolve_device(spec.device)
        self.lr = spec.lr
        self.momentum = spec.momentum
        self.seed = seed
        self._model: Optional[ToyCNN] = None
        self._optimizer: Optional[torch.optim.Optimizer] = None
        self._loss_fn = MASKED_LOSSES.get(spec.kind) or nn.CrossEntropyLoss()
        self._timer: Any = None
        self._first_step_ms: Optional[float] = None
        self._phase_ms: Dict[str, List[float]] = {phase: [] for phase in TOY_CNN_PHASES}
        self._timed_ms: List[float] = []
        self._first_loss: Optional[torch.Tensor] = None
        self._last_loss: Optional[torch.Tensor] = None
        self._time_phases = True

    def run_ahead(self) -> None:
        """Steps return once queued (run.sync=async): nothing waits, so phases go untimed."""
        self._time_phases = False

    def _build(self, data: Any) -> None:
        """Build model, optimizer and timer for this batch's image size, on the target device."""
        if data.dim() != 4 or data.shape[1] != TOY_CNN_IN_CHANNELS:
            raise ToyCnnInputError(f"toy_cnn needs batches of [B, 3, H, W] images, got {list(data.shape)}")
        height, width = int(data.shape[-2]), int(data.shape[-1])
        toy_cnn_blocks(height, width)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = ToyCNN(height)
        self._model = model.to(self.device).train()
        self._optimizer = torch.optim.SGD(self._model.parameters(), lr=self.lr, momentum=self.momentum)
        cuda = self.device.type == "cuda"
        if not self._time_phases:
            self._timer = UntimedPhases()
        else:
            self._timer = CudaPhaseTimer(len(TOY_CNN_PHASES)) if cuda else HostPhaseTimer()

    def _inputs(self, data: Any, labels: Any):
        x = torch.as_tensor(data).to(self.device, non_blocking=True)
        x = x.float().div_(255) if x.dtype == torch.uint8 else x.float()
        y = torch.as_tensor(labels).to(self.device, non_blocking=True).long()
        return x, y

    def step(self, data: Any, labels: Any) -> None:
        first = self._model is None
        start = time.perf_counter_ns()
        if first:
            self._build(data)
        timer, model, optimizer = self._timer, self._model, self._optimizer
        timed_start = time.perf_counter_ns()
        timer.mark()
        x, y = self._inputs(data, labels)
        timer.mark()
        loss = self.loss(model(x), y)
        timer.mark()
        loss.backward()
        timer.mark()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timer.mark()
        phase_ms = timer.finish()  # on CUDA: waits for this step's kernels, unless running ahead
        timed_ms = (time.perf_counter_ns() - timed_start) / NS_PER_MS
        loss = loss.detach()
        if first:
            # Model build, CUDA context and first-call kernels selection: reported apart.
            self._first_step_ms = (time.perf_counter_ns() - start) / NS_PER_MS
            self._first_loss = loss
        elif phase_ms:
            for phase, ms in zip(TOY_CNN_PHASES, phase_ms):
                self._phase_ms[phase].append(ms)
            self._timed_ms.append(timed_ms)
        self._last_loss = loss

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The training loss; the `forward` phase's time includes it."""
        return self._loss_fn(logits, labels)

    def report(self) -> Dict[str, Any]:
        """Device, size, timer, per-phase ms (mean/median, first step apart) and first/last loss.

        `phases_ms` and `timed_ms` cover the same steps: every step but the first, so warm-up and
        the profiled steps after the measured ones too (under CUPTI a launch-bound step runs
        slower). Compare them with each other, not with the job's measured steps. `timed_ms` is
        the host time from the first phase mark to the end of the wait for the last: a CUDA
        event runs on the GPU after the host recorded it, and the wait returns after the last
        one ran, so the phases of a step sum to at most its `timed_ms` (on the CPU the marks are
        host clock readings inside the same region).
        """
        model = self._model
        return {
            "kind": self.kind,
            "device": str(self.device),
            "lr": self.lr,
            "momentum": self.momentum,
            "input_size": model.input_size if model is not None else None,
            "blocks": len(model.blocks) if model is not None else None,
            "parameters": sum(p.numel() for p in model.parameters()) if model is not None else None,
            "timer": self._timer.name if self._timer is not None else None,
            "first_step_ms": self._first_step_ms,
            "phases_ms": {phase: _summary_ms(ms) for phase, ms in self._phase_ms.items()},
            "timed_ms": _summary_ms(self._timed_ms),
            "loss_first": float(self._first_loss) if self._first_loss is not None else None,
            "loss_last": float(self._last_loss) if self._last_loss is not None else None,
        }


def build_consumer(spec: ConsumerSpec, seed: int) -> Consumer:
    """The consumer `spec` names; `seed` makes its random draws (step times, weights) reproducible."""
    if spec.kind == NO_CONSUMER:
        return NoConsumer()
    if spec.kind == EMULATED:
        return EmulatedConsumer(StepTimeDistribution(spec.distribution, spec.step_ms, spec.spread_ms), seed)
    if spec.kind == "toy_cnn" or spec.kind in MASKED_LOSSES:
        return ToyCnnConsumer(spec, seed)
    raise ConfigError(f"consumer.kind must be none, emulated, toy_cnn or one of {', '.join(MASKED_LOSSES)}, "
                      f"got {spec.kind!r}")


# Where transform.on_device steps run when the consumer has no device: the host CPU, in the main process.
HOST_DEVICE = "cpu"


def on_device_of(spec: ConsumerSpec) -> str:
    """The device transform.on_device steps run on: the consumer's, or the host CPU when it has
    none (the step loop copies the batch there first). Asks only whether CUDA exists."""
    device = build_consumer(spec, seed=0).device  # the seed draws step times and weights, never the device
    return HOST_DEVICE if device is None else str(device)
