"""nvImageCodec as a region-of-interest JPEG decoder: loaded quietly, one decoder a thread of each process.

`nvidia-nvimgcodec-cu12` (a core dependency on Linux; the `decode` extra) decodes a rectangle of a
JPEG without decoding the rest (libjpeg-turbo's cropped scanlines on its CPU backend; nvJPEG on its
GPU backend, which also needs the nvJPEG wheel of the CUDA that torch was built for:
`gpu_install_command`). On first use it prints, from native code, that it cannot find optional
sub-libraries (nvJPEG, nvJPEG2000, nvTIFF): `load_nvimgcodec` sets its verbosity to silent and holds
the process's stdout and stderr closed while it loads, so none of that reaches the user's console.

A Decoder is not shared between threads. nvImageCodec's Python `Decoder.decode` releases the GIL
around its C call (`nvimgcodecDecoderDecode` and the wait on its future, python/decoder.cpp), and
its documentation says only that "not all nvImageCodec types are thread safe". Two threads in one
Decoder broke it here: 4 threads x 250 region decodes of the catalogue photos gave wrong or missing
regions, `[ERROR] [nvimgcodec] std::future_error: Broken promise` on fd 2 (the core library's own
log, which PYNVIMGCODEC_VERBOSITY does not silence) and, one run in three, SIGABRT. NVIDIA's own
users keep one decoder a thread (DALI's nvImageCodec decoders, each with max_num_cpu_threads=1,
indexed by thread) or lock a shared one (cuCIM's fix for the same segfault); a lock would serialise
the decode the thread backends and the thread profile measure, so each thread makes its own
Decoder (about 10 us) on its first call, and again after a fork.

`RegionCodec.decode` returns the region as a uint8 [3, H, W] tensor (RGB, as decode_jpeg gives),
or None for anything it does not take (a region outside the image, a CMYK or non-8-bit JPEG, a
stream it cannot parse): the caller then decodes the whole file its usual way.
"""

import contextlib
import ctypes
import importlib
import io
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from pipebench.base.extras import install_line

MODULE = "nvidia.nvimgcodec"
# The library and pipebench's extra that installs it, as a line for a user without it names them.
LIBRARY = "nvImageCodec"
EXTRA = "decode"
# nvImageCodec's own switch for its log (0: nothing); a value the user set is kept.
VERBOSITY_ENV = "PYNVIMGCODEC_VERBOSITY"
SILENT = "0"
# The CPU backend's decoder runs on the calling thread only: DataLoader workers and workers=0 runs
# are measured with one intra-op thread each, so per-transform times compare; the decode may not
# spread over more cores either.
CPU_THREADS = 1
# JPEG colour models whose conversion to RGB differs between decoders (Adobe CMYK inversion): the
# chain's own decoder does them, so the region decode gives the same pixels or none.
FOREIGN_COLOR = ("CMYK", "YCCK")
# The only sample precision whose pixels are what decode_jpeg and PIL give (12-bit is rescaled).
EIGHT_BITS = 8
CPU = "cpu"
# Interpolated 4:2:0 chroma upsampling, as libjpeg-turbo's (PIL, decode_jpeg on the CPU, the CPU
# backend). nvImageCodec 0.9's GPU backend already decoded whole 4:2:0 images within 1 grey level of
# PIL at colour edges on the H100 host with or without it, where torchvision's nvJPEG decode
# (nearest-neighbour chroma) was 129 levels off; naming it keeps that should the default change.
GPU_OPTIONS = ":fancy_upsampling=1"
# How far a region the GPU backend decodes may be from PIL's pixels (two IDCTs' rounding), as the
# equivalence check's default bound.
GPU_PIXEL_BOUND = 4

# Held while fds 1 and 2 point at /dev/null: the process has one pair, so two threads closing them at
# once could each restore the other's /dev/null and silence the console for good. A fork waits for
# it, so no child starts with its output closed (the stdlib's pattern for concurrent.futures' lock).
_OUTPUT_CLOSED = threading.Lock()
os.register_at_fork(before=_OUTPUT_CLOSED.acquire, after_in_parent=_OUTPUT_CLOSED.release,
                    after_in_child=_OUTPUT_CLOSED.release)


@contextlib.contextmanager
def _fds_to_null() -> Iterator[None]:
    """fds 1 and 2 point at /dev/null inside; C stdio buffers are flushed before they come back.
    The caller holds _OUTPUT_CLOSED."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).fflush(None)
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def load_nvimgcodec() -> Any:
    """The nvimgcodec module, imported without its console output; raises ImportError without it.
    Threads wait for the one that loads it (sys.modules holds the module before its import ends)."""
    with _OUTPUT_CLOSED:
        loaded = sys.modules.get(MODULE)
        if loaded is not None:
            return loaded
        os.environ.setdefault(VERBOSITY_ENV, SILENT)
        with _fds_to_null():
            module = importlib.import_module(MODULE)
            _new_decoder(module, CPU)  # the library sets itself up (and prints) on its first decoder
    return module


def _new_decoder(module: Any, device: str) -> Any:
    if device == CPU:
        return module.Decoder(device_id=module.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=CPU_THREADS,
                              backends=[module.Backend(module.BackendKind.CPU_ONLY)])
    index = torch.device(device).index
    return module.Decoder(device_id=index if index is not None else torch.cuda.current_device(),
                          backends=[module.Backend(module.BackendKind.GPU_ONLY),
                                    module.Backend(module.BackendKind.HW_GPU_ONLY)], options=GPU_OPTIONS)


class RegionDecodeFailed(RuntimeError):
    """A batch's regions all came back empty: the decoder's backend, not the files, failed."""


@dataclass(frozen=True)
class _ThreadDecoder:
    """One thread's decoder, with what its calls share, and the process it was made in."""

    module: Any
    decoder: Any
    params: Any
    pid: int


class RegionCodec:
    """nvImageCodec decoders on `device` ("cpu": the CPU backend; "cuda[:k]": nvJPEG): one a thread of
    each process, made on the thread's first call, never shared or pickled (see the module's note)."""

    def __init__(self, device: str = CPU):
        self.device = device
        self._threads = threading.local()

    def __reduce__(self) -> Tuple[type, Tuple[str]]:
        return type(self), (self.device,)  # each process makes its own decoders

    def _ready(self) -> _ThreadDecoder:
        """This thread's decoder, made here on first use; a forked child makes its own."""
        mine = getattr(self._threads, "decoder", None)
        if mine is None or mine.pid != os.getpid():
            module = load_nvimgcodec()
            if self.device == CPU:  # the library printed its notices when it loaded
                decoder = _new_decoder(module, CPU)
            else:
                with _OUTPUT_CLOSED, _fds_to_null():  # one thread at a time
                    decoder = _new_decoder(module, self.device)
            # decode_jpeg ignores EXIF orientation, so the region must too, or the boxes would differ.
            params = module.DecodeParams(apply_exif_orientation=False, color_spec=module.ColorSpec.SRGB)
            mine = _ThreadDecoder(module, decoder, params, os.getpid())
            self._threads.decoder = mine
        return mine

    def stream(self, data: bytes, top: int, left: int, height: int, width: int) -> Optional[Any]:
        """The region's code stream, or None when this decoder does not take the file or the box."""
        module = self._ready().module
        try:  # the header is parsed on first access to it
            whole = module.CodeStream(data)
            foreign = whole.precision != EIGHT_BITS or whole.color_spec.name in FOREIGN_COLOR
        except RuntimeError:  # not a stream it can parse: the full decode says what is wrong
            return None
        if foreign or top < 0 or left < 0 or height <= 0 or width <= 0 or top + height > whole.height \
                or left + width > whole.width:
            return None
        return whole.get_sub_code_stream(region=module.Region(top, left, top + height, left + width))

    def decode(self, data: bytes, top: int, left: int, height: int, width: int) -> Optional[torch.Tensor]:
        """The region rows top..top+height, columns left..left+width as uint8 [3, height, width], or None."""
        region = self.stream(data, top, left, height, width)
        if region is None:
            return None
        mine = self._ready()
        try:
            image = mine.decoder.decode(region, params=mine.params)
        except RuntimeError:
            return None
        return None if image is None else as_tensor(image)

    def decode_batch(self, items: Sequence[Tuple[bytes, Sequence[int]]]) -> List[Optional[torch.Tensor]]:
        """Each (JPEG bytes, (top, left, height, width)) region decoded in one call to the decoder, as
        uint8 [3, h, w] on this codec's device; None for each it does not take (see `decode`).

        Raises RegionDecodeFailed when it took regions and decoded none of them: its backend is not
        working in this process (on the H100 host, nvImageCodec's GPU backend without nvJPEG), and
        every region would otherwise be decoded whole by the fallback under the region decode's name."""
        mine = self._ready()
        streams = [self.stream(data, *(int(v) for v in box)) for data, box in items]
        taken = [s for s in streams if s is not None]
        kwargs = {"params": mine.params}
        if self.device != CPU:  # decode on torch's current stream, so later kernels see the pixels
            kwargs["cuda_stream"] = torch.cuda.current_stream(torch.device(self.device)).cuda_stream
        try:
            decoded = list(mine.decoder.decode(taken, **kwargs)) if taken else []
        except RuntimeError:
            decoded = [None] * len(taken)
        if decoded and all(image is None for image in decoded):
            raise RegionDecodeFailed(f"nvImageCodec on {self.device} decoded none of the batch's {len(decoded)} "
                                     f"JPEG regions: its backend does not work in this process "
                                     f"({install_command(self.device)} if one is missing)")
        images = iter(decoded)
        found = [next(images) if stream is not None else None for stream in streams]
        return [None if image is None else as_tensor(image) for image in found]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device!r})"


def as_tensor(image: Any) -> torch.Tensor:
    """An nvimgcodec Image (HWC) as a uint8 [C, H, W] tensor on its own device. On the host it stays a
    view of the HWC pixels (each decode owns its buffer): torchvision's uint8 antialiased resize reads
    that channels-last layout with its vector kernel, 2.2x faster here on a RandomResizedCrop box
    (0.12 against 0.27 ms for a 400x500 region) than from the contiguous [C, H, W] copy."""
    if getattr(image, "buffer_kind", None) is not None and "DEVICE" in str(image.buffer_kind):
        return torch.from_dlpack(image).permute(2, 0, 1).contiguous()
    return torch.from_numpy(np.asarray(image.cpu())).permute(2, 0, 1)


def gpu_install_command() -> str:
    """The pip line for nvImageCodec's GPU backend under this torch's CUDA (nvJPEG is a wheel of its own;
    CUDA 13's wheels dropped the -cuNN suffix from nvjpeg's name)."""
    major = (torch.version.cuda or "12").split(".")[0]
    nvjpeg = "nvidia-nvjpeg" if int(major) >= 13 else f"nvidia-nvjpeg-cu{major}"
    return f"pip install nvidia-nvimgcodec-cu{major} {nvjpeg}"


def install_command(device: str) -> str:
    """The pip line a failure of the region decode on `device` names: the decode extra on the CPU."""
    return install_line([EXTRA]) if device == CPU else gpu_install_command()


def region_decode_problem(device: str = CPU) -> str:
    """Why the region decode cannot run on `device` here ("" when it can): not installed, or its
    backend there (the CPU's, or the GPU's with nvJPEG) fails to decode a small JPEG's region to the
    pixels PIL gives (exactly on the CPU, within GPU_PIXEL_BOUND on a GPU)."""
    on_gpu = device != CPU
    install = install_command(device)
    try:
        load_nvimgcodec()
    except ImportError as exc:
        return f"nvImageCodec is not installed ({install}): {str(exc).splitlines()[0]}"
    rng = np.random.default_rng(0)  # colour edges, where chroma upsampling shows
    pixels = np.repeat(np.repeat(rng.integers(0, 256, (4, 6, 3), dtype=np.uint8), 8, 0), 8, 1)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=95)
    backend = "GPU backend (nvJPEG)" if on_gpu else "CPU backend"
    try:
        got = RegionCodec(device).decode(buffer.getvalue(), 8, 16, 16, 24)
    except Exception as exc:  # a broken install fails in any way; the plan says how, in one line
        return f"nvImageCodec's {backend} fails here: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    want = torch.from_numpy(np.array(Image.open(buffer).convert("RGB"))).permute(2, 0, 1)[:, 8:24, 16:40]
    if got is None:
        return f"nvImageCodec's {backend} does not decode a JPEG region in this process ({install} if one is missing)"
    worst = int((got.cpu().to(torch.int16) - want.to(torch.int16)).abs().max())
    if worst > (GPU_PIXEL_BOUND if on_gpu else 0):
        return (f"nvImageCodec's {backend} decodes a JPEG region {worst} grey levels from PIL's pixels here "
                f"({install} to repair it)")
    return ""
