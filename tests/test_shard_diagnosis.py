"""The diagnosis of sharded data beyond idle workers: uneven shards (the largest shard's share, the tail
where one worker reads alone), modelled from each shard's samples and seen in a real DataLoader's order;
the first batch of a sharded set taken apart (the opens, the shuffle buffer's fill, the first decode); and
samples/s window by window across the epoch, as a plot."""

from pathlib import Path

import pytest
from torch.utils.data import DataLoader
from torchvision.transforms import PILToTensor

from pipebench.cli.dataset import convert
from pipebench.config.specs import StorageSpec
from pipebench.datasets.webdataset_shards import WebDatasetShards
from pipebench.measure.coverage import check_coverage
from pipebench.measure.first_batch_parts import FirstBatchLog, FirstBatchParts, first_batch_columns
from pipebench.model.shards import reader_loads, uneven_line, uneven_shards
from pipebench.storage.file_reads import READ_FILES
from pipebench.pipeline.timed_chain import TimedCollate
from pipebench.pipeline.timed_iterable import InstrumentedIterable
from pipebench.record.jobs import JobResult
from pipebench.report.comparison import build_table, group_rows
from pipebench.report.diagnosis import diagnose, render_diagnosis
from pipebench.report.plots import EPOCH_PNG, EPOCH_TITLE, epoch_figure, window_rates, write_plots
from stored_results import transform_row

# Ten 32x32 JPEGs in shards of 2: five shards, so at 4 workers worker 0 reads two of them (4 samples)
# and the others one each (2 samples): worker 0 reads the last half of the epoch alone.
IMAGES, SHARD_SIZE, WORKERS = 10, 2, 4
TINY_CORPUS = [f"dataset.num_images={IMAGES}", f"dataset.length={IMAGES}", "dataset.width=32", "dataset.height=32"]
PATTERN = "shard-{000000..000004}.tar"


# The emulated latency of a shard's open in the first-batch test: far above an open's own time here.
OPEN_LATENCY_S = 0.04


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("uneven")
    convert("webdataset", root / "wds", SHARD_SIZE, [*TINY_CORPUS, f"dataset.cache_dir={root / 'cache'}"])
    return WebDatasetShards(str(root / "wds" / PATTERN))


def test_the_model_gives_each_reader_its_shards_samples_and_the_lone_tail():
    counts = [1000] * 5
    assert [samples for _, samples in reader_loads(counts, 1, 4)] == [2000, 1000, 1000, 1000]
    uneven = uneven_shards(counts, 1, 4)
    assert (uneven.largest_share, uneven.busiest, uneven.lone_share, uneven.slowdown) == (0.2, (0, 0), 0.5, 1.6)
    line = uneven_line("webdataset", counts, 1, 4)
    assert ("the largest of 5 holds 20% of the epoch's 5000 samples, and at 4 workers worker 0 reads 2000 against "
            "1000 for the next busiest, so for the last 50% of the epoch it reads alone while the other 3 wait, and "
            "the epoch takes 1.60x an even split's time") in line
    assert uneven_line("webdataset", [1000] * 8, 1, 4) == "", "an even split has no tail"
    assert uneven_line("webdataset", [1000] * 10 + [500], 1, 4) == "", "the two busiest finish together"
    assert uneven_shards([1000], 1, 4) is None, "one busy reader: idle_line's case, not this one"
    assert "rank 0 reads 1100 against 100" in uneven_line("webdataset", [100, 100, 1000], 2, 0)


def _worker_order(dataset, epochs):
    """The worker of each batch a real DataLoader delivers over `epochs` epochs, and each batch's epoch."""
    loader = DataLoader(InstrumentedIterable(dataset, [PILToTensor()]), batch_size=1, num_workers=WORKERS,
                        collate_fn=TimedCollate([]))
    order = [(epoch, batch.worker_id) for epoch in range(1, epochs + 1) for batch in loader]
    return [epoch for epoch, _ in order], [worker for _, worker in order]


def _result(job, workers, shard_samples, passes):
    return {
        "job": job,
        "job_num": int(job.split("-")[1]),
        "config": {},
        "overrides": ["dataset=webdataset", f"workers={workers}"],
        "summary": {"job": job, "transform": "t", "workers": workers, "batch_size": 1, "samples_per_s": 100.0,
                    "samples_per_s_ci_low": 90.0, "samples_per_s_ci_high": 110.0,
                    "starvation_pct": 0.0, "pipeline_ms_per_sample": 1.0, "cpu_ms_per_sample": 1.0,
                    "transfer_ms_median": 1.0, "ready_next_ms_median": 0.2},
        "transforms": [transform_row("decode", 1.0, stage="decode")],
        "passes": passes,
        "consumer_report": {"kind": "none", "device": None},
        "fingerprint": {"usable_cores": 2,
                        "dataset": {"name": "webdataset", "shards": len(shard_samples), "shard_samples": shard_samples}},
        "pin_memory_effective": False,
    }


def test_a_real_loader_ends_the_epoch_with_the_busiest_worker_alone_and_the_report_says_so(shards):
    """Known truth: worker 0 holds 4 of the 10 samples, the rest 2 each, so the DataLoader's last two
    batches of each epoch come from worker 0 alone; the report's line gives the model and the tail measured."""
    assert list(shards.offsets.counts) == [SHARD_SIZE] * 5 and shards.identity()["shard_samples"] == [2] * 5
    epochs, workers = _worker_order(shards, 2)
    assert workers[IMAGES - 2:IMAGES] == [0, 0] and workers[IMAGES - 3] != 0
    passes = [{"epoch": epochs, "worker_id": workers, "step_ms": [100.0] * len(epochs), "compute_ms": [0.0] * 20,
               "h2d_ms": [0.0] * 20}]
    text = render_diagnosis(diagnose([_result("job-0", 0, [2] * 5, passes),
                                      _result("job-1", WORKERS, [2] * 5, passes)]))
    assert ("webdataset: uneven shards: the largest of 5 holds 20% of the epoch's 10 samples, and at 4 workers "
            "worker 0 reads 4 against 2 for the next busiest, so for the last 50% of the epoch it reads alone") in text
    assert ("measured (job-1): the last 2 batches of epoch 1 came from worker 0 alone, 0.2 s of the epoch's 1 s "
            "in the window") in text
    assert text.count("uneven shards") == 1, "workers=0 has one reader: no tail"


def _first_batch(dataset):
    """The first batch of one sample the timed chain makes from `dataset`, seen by a FirstBatchLog."""
    seen = []
    log = FirstBatchLog(lambda batch, epoch: seen.append(batch))
    log(TimedCollate([])([next(iter(InstrumentedIterable(dataset, [PILToTensor()])))]), 1)
    return log.parts, seen[0]


@pytest.mark.parametrize("buffer, opened", [(0, 1), (6, 3)])
def test_the_first_batch_is_taken_apart_into_the_opens_the_buffers_fill_and_the_decode(shards, buffer, opened):
    """Known truth: a shuffle buffer of 6 over shards of 2 reads 3 shards before its first sample comes out,
    each open sleeping the emulated latency; without a buffer the first sample opens one."""
    dataset = WebDatasetShards(shards.pattern, shuffle_buffer=buffer)
    dataset.reads.use(StorageSpec(latency_ms=1000 * OPEN_LATENCY_S))
    parts, batch = _first_batch(dataset)
    assert batch.sample_io[0, READ_FILES] == opened
    assert parts.open_s >= opened * OPEN_LATENCY_S
    assert parts.fill_s > 0 and parts.decode_s > 0
    assert parts.fill_s == pytest.approx(batch.sample_ns[0, 0] / 1e9 - parts.open_s), "the load less its opens"


def test_the_columns_are_each_parts_median_over_the_repeats_that_measured_it():
    columns = first_batch_columns([FirstBatchParts(0.1, 0.2, None), FirstBatchParts(0.3, 0.4, None), None])
    assert columns == {"first_batch_open_s": pytest.approx(0.2), "first_batch_fill_s": pytest.approx(0.3),
                       "first_batch_decode_s": None}


def test_window_rates_cut_whole_worker_cycles_and_keep_the_epochs_end():
    """Known truth: 8 steps of 2 samples at workers=2 are 4 windows of one cycle; the last two steps took
    twice as long, so the last window's rate halves, and it is kept, not dropped as a short tail."""
    ends, rates = window_rates([2] * 8, [100.0] * 6 + [200.0] * 2, workers=2)
    assert ends.tolist() == pytest.approx([0.2, 0.4, 0.6, 1.0]) and rates.tolist() == pytest.approx([20, 20, 20, 10])
    ends, rates = window_rates([1] * 65, [10.0] * 65, workers=1)
    assert len(rates) == 33 and ends[-1] == pytest.approx(0.65), "2-step windows, and the step left over"


def test_the_epoch_plot_draws_a_line_a_job_with_its_epoch_ends(shards, tmp_path):
    epochs, workers = _worker_order(shards, 2)
    step_ms = [50.0] * (IMAGES - 2) + [100.0, 100.0] + [50.0] * (IMAGES - 2) + [100.0, 100.0]
    passes = [{"epoch": epochs, "worker_id": workers, "step_ms": step_ms, "samples": [1] * len(epochs),
               "compute_ms": [0.0] * 20, "h2d_ms": [0.0] * 20}]
    checked = check_coverage({1: list(range(IMAGES)), 2: list(range(IMAGES))}, length=IMAGES, complete={1, 2})
    results = [JobResult.from_stored({**_result("job-1", WORKERS, [2] * 5, passes), "coverage": checked.as_dict()})]
    table = build_table(group_rows([(Path("run"), results)]))
    figure = epoch_figure(table)
    assert figure.get_suptitle() == EPOCH_TITLE
    axes = figure.axes[0]
    (line,) = axes.get_lines()[:1]
    assert line.get_label().endswith("(2 epochs)") and "samples/s" in axes.get_ylabel()
    assert min(line.get_ydata()) < max(line.get_ydata()), "the lone tail's slower steps show"
    assert len(axes.get_lines()) == 2, "the line and one dotted epoch end"
    outcome = next(o for o in write_plots(table, tmp_path) if o.name == EPOCH_PNG)
    assert outcome.written and (tmp_path / EPOCH_PNG).read_bytes()[:4] == b"\x89PNG"
