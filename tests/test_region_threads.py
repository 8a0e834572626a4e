"""Region decode on threads (pipebench.transforms.region_codec): each thread decodes with a decoder of
its own, so regions decoded on 4 threads at once are the bytes one thread gives, and nvImageCodec's
`Broken promise` errors (written by its C++ core to fd 2) never reach the console. The thread
backends and the thread profile call a chain's region decode so."""

import importlib.util
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from pipebench.datasets.synthetic_jpeg import SyntheticJpegDataset
from pipebench.transforms import region_codec
from pipebench.transforms.region_codec import RegionCodec

# Asked without importing it: a plain import would print nvImageCodec's notices (load_nvimgcodec does not).
pytestmark = pytest.mark.skipif(importlib.util.find_spec(region_codec.MODULE) is None,
                                reason="nvImageCodec is not installed (the decode extra)")
THREADS = 4
# 1,000 decodes in all: a shared decoder gave wrong regions, Broken promise lines or SIGABRT in most
# runs of this many; about 0.6 s on one thread of the 2-core VM.
DECODES = 1000
SIDE = 48


def _jobs(tmp_path):
    """DECODES (JPEG bytes, box) pairs over two catalogue photos (533x800), boxes spread over each."""
    dataset = SyntheticJpegDataset(length=2, num_images=2, cache_dir=tmp_path)
    photos = [open(path, "rb").read() for path in dataset.files()]
    return [(photos[i % 2], ((i * 37) % (800 - SIDE), (i * 53) % (533 - SIDE), SIDE, SIDE)) for i in range(DECODES)]


def _on_threads(codec, jobs):
    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(lambda job: codec.decode(job[0], *job[1]), jobs))


def test_four_threads_decode_the_bytes_one_thread_does_and_print_nothing(tmp_path, capfd):
    jobs = _jobs(tmp_path)
    codec = RegionCodec()  # one codec shared by the threads, as a chain is under the thread backends
    threaded = _on_threads(codec, jobs)
    alone = [RegionCodec().decode(data, *box) for data, box in jobs]
    out, err = capfd.readouterr()
    assert "Broken promise" not in err and "nvimgcodec" not in err and out == "", err[-2000:]
    assert all(region is not None and region.shape == (3, SIDE, SIDE) for region in alone)
    differ = sum(not torch.equal(a, b) for a, b in zip(threaded, alone) if a is not None)
    assert threaded.count(None) == 0 and differ == 0, f"{threaded.count(None)} missing, {differ} differ"


def test_a_decoder_is_used_only_by_the_thread_that_made_it(tmp_path, monkeypatch):
    """nvImageCodec's Decoder is not safe to share between threads: each call checks it was made on its own."""
    real = region_codec._new_decoder
    made, wrong = [], []

    class Watched:
        def __init__(self, decoder):
            self.decoder, self.owner = decoder, threading.get_ident()
            made.append(self)

        def decode(self, *args, **kwargs):
            if threading.get_ident() != self.owner:
                wrong.append(threading.get_ident())
            return self.decoder.decode(*args, **kwargs)

    monkeypatch.setattr(region_codec, "_new_decoder", lambda module, device: Watched(real(module, device)))
    jobs = _jobs(tmp_path)[:THREADS * 10]
    codec = RegionCodec()
    codec.decode(jobs[0][0], *jobs[0][1])  # made on this thread first
    _on_threads(codec, jobs)
    assert not wrong and len(made) >= 2, f"{len(wrong)} calls on another thread's decoder"


def test_a_forked_child_makes_its_own_decoder(tmp_path, monkeypatch):
    """A DataLoader worker forked after the parent decoded does not decode with the parent's decoder."""
    data, box = _jobs(tmp_path)[0]
    codec = RegionCodec()
    first = codec.decode(data, *box)
    parents = codec._ready()
    monkeypatch.setattr(region_codec.os, "getpid", lambda: parents.pid + 1)  # as in a forked child
    assert torch.equal(codec.decode(data, *box), first)
    assert codec._ready().decoder is not parents.decoder
