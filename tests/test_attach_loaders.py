"""`pipebench attach` on what real training scripts do (issue 41.7): two loaders made at one line, a
loader that keeps its workers in a reference cycle, datasets whose samples attach cannot time, a
decode inside an ImageFolder's `__getitem__`, and an eval loader of a handful of steps.

Each case is a small script or loader standing in for the real one (timm's `create_loader` and
`MultiEpochsDataLoader`, a Hugging Face `with_transform` dataset, a WebDataset pipeline).
"""

import csv
import json
import textwrap
import time
from types import SimpleNamespace

import torch
from PIL import Image
from stored_results import result_record, write_record
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

import pipebench
from pipebench.attach.call_site import UNKNOWN_SITE, CallSite, call_site, user_code
from pipebench.attach.watch import LoaderIdentity, WatchWindow, watching_loaders
from pipebench.attach.watched import summary_line
from pipebench.cli.attach import run_script
from pipebench.cli.main import main
from pipebench.config.specs import USER_STEP
from pipebench.pipeline.stages import DECODE_STAGE, LOAD_STAGE
from pipebench.record.jobs import override_pairs
from pipebench.record.results import read_result
from pipebench.report.writer import REPORT_MD

# timm's create_loader makes the train and the eval loader at one line; the script iterates each
# in a function of its own, as train.py's train_one_epoch and validate do.
FACTORY = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Images(Dataset):
        def __init__(self, n):
            self.n = n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            return torch.zeros(3), i

    def create_loader(dataset, batch_size):
        return DataLoader(dataset, batch_size=batch_size)

    def train_one_epoch(loader):
        for x, y in loader:
            torch.ones(64, 64) @ torch.ones(64, 64)

    def validate(loader):
        for x, y in loader:
            pass

    train_loader = create_loader(Images(256), 4)
    eval_loader = create_loader(Images(64), 8)
    for epoch in range(2):
        train_one_epoch(train_loader)
        validate(eval_loader)
""")


def _line(script: str, text: str) -> int:
    return next(n for n, line in enumerate(script.splitlines(), 1) if text in line)


def _attach_factory(tmp_path, capsys):
    script, out = tmp_path / "train.py", tmp_path / "out"
    script.write_text(FACTORY)
    assert main(["attach", "--steps", "12", "--skip-steps", "1", "--out", str(out), "--", "python", str(script)]) == 0
    return out, capsys.readouterr().out


def test_two_loaders_made_at_one_line_are_two_loaders_each_described_on_its_own(tmp_path, capsys):
    out, printed = _attach_factory(tmp_path, capsys)
    jobs = [read_result(out / f"job-{n}" / "result.json") for n in range(2)]
    pairs = [override_pairs(job["overrides"]) for job in jobs]
    assert jobs[0]["job"] != jobs[1]["job"]
    site = f"train.py:{_line(FACTORY, 'return DataLoader(')}"
    assert [p["loader"] for p in pairs] == [site, site]
    assert [p["iterated"] for p in pairs] == [f"train.py:{_line(FACTORY, 'for x, y in loader:')}",
                                              f"train.py:{_line(FACTORY, 'for x, y in loader:') + 4}"]
    assert [p["dataset"] for p in pairs] == ["Images[256]", "Images[64]"]
    assert [p["created"] for p in pairs] == ["1", "2"]
    # attach's own table tells them apart, and attach wrote report.md as run does.
    assert "created=1" in printed and "created=2" in printed
    report = (out / REPORT_MD).read_text()
    # One row a loader, neither ranked against the other: no best mark, no speed-up, no sweep advice.
    assert report.count("| Images[256] ") == 1 and report.count("| Images[64] ") == 1
    for ranking in ("★", "speedup", "to the sweep"):
        assert ranking not in report
    assert main(["report", str(out), "--out", str(tmp_path / "again")]) == 0
    assert "★" not in (tmp_path / "again" / REPORT_MD).read_text()
    # Compared where the user asks.
    assert main(["report", str(out), "--out", str(tmp_path / "compared"), "--compare-loaders"]) == 0
    assert "★" in (tmp_path / "compared" / REPORT_MD).read_text()


def test_baseline_on_loaders_needs_compare_loaders(tmp_path, capsys):
    out, _ = _attach_factory(tmp_path, capsys)
    assert main(["report", str(out), "--out", str(tmp_path / "r"), "--baseline", "created=1"]) == 2
    assert "--compare-loaders" in capsys.readouterr().err


def _watched(num, job, rate, **summary):
    return result_record(num, [job], rates=[rate], summary={"consumer": USER_STEP, **summary}, job=job)


def test_the_report_never_pools_two_loaders_under_one_name(tmp_path, capsys):
    """Results an older attach wrote, where timm's train and eval loaders shared a creation site's
    name: the report refuses them rather than read them as two rounds of one job."""
    folder = tmp_path / "old"
    write_record(folder, _watched(0, "loader=loader.py:467", 116.0))
    write_record(folder, _watched(1, "loader=loader.py:467", 316.0, batch_size=32))
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "job-0" in err and "job-1" in err and "loader=loader.py:467" in err


def test_jobs_that_differ_beyond_their_label_are_not_pooled(tmp_path, capsys):
    folder = tmp_path / "run"
    write_record(folder, result_record(0, ["workers=2"], rates=[100.0]))
    write_record(folder, result_record(1, ["workers=2"], rates=[300.0], summary={"workers": 4}))
    assert main(["report", str(folder)]) == 2
    assert "job-1" in capsys.readouterr().err


# timm's MultiEpochsDataLoader: one iterator of the loader, over a sampler that never ends, kept by
# the loader itself, so the workers live in a reference cycle until the garbage collector frees it.
MULTI_EPOCHS = textwrap.dedent("""
    import sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class _RepeatSampler:
        def __init__(self, sampler):
            self.sampler = sampler
        def __iter__(self):
            while True:
                yield from iter(self.sampler)

    class MultiEpochsDataLoader(DataLoader):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._DataLoader__initialized = False
            self.batch_sampler = _RepeatSampler(self.batch_sampler)
            self._DataLoader__initialized = True
            self.iterator = super().__iter__()
        def __len__(self):
            return len(self.batch_sampler.sampler)
        def __iter__(self):
            for _ in range(len(self)):
                yield next(self.iterator)

    class Tiny(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return torch.zeros(3)

    def main():
        loader = MultiEpochsDataLoader(Tiny(), batch_size=4, num_workers=2)
        for epoch in range(2):
            for x in loader:
                pass
        with open(sys.argv[1], "w") as f:
            f.write(repr(time.time()))

    main()
""")
# torch joins each worker for up to 5 s (MP_STATUS_CHECK_INTERVAL) when it cannot tell it to stop;
# the bare script exits at once. Well under one such wait, and room for a loaded host's collect.
SCRIPT_END_BOUND_S = 2.5


def test_a_loader_whose_workers_live_in_a_cycle_adds_no_time_after_the_script(tmp_path):
    script, ended = tmp_path / "multi.py", tmp_path / "ended"
    script.write_text(MULTI_EPOCHS)
    # A window that ends inside the run: the watch lets go of the loader, as in a long training run.
    with watching_loaders(WatchWindow(steps=3, skip_steps=1)) as watches:
        assert run_script("path", str(script), [str(ended)]) == 0
        returned = time.time()
    assert watches[0].done
    assert returned - float(ended.read_text()) < SCRIPT_END_BOUND_S


# A WebDataset pipeline: an IterableDataset whose decode and transforms run inside its own iterator.
SHARDS = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    class Shards(IterableDataset):
        def __iter__(self):
            for i in range(400):
                yield torch.full((3,), float(i)) * 2

    class HubDataset(Dataset):
        # Hugging Face's Dataset: batches fetched by __getitems__, with_transform's function kept
        # in the dataset's format rather than under `transform`.
        def __init__(self, fn):
            self._format_transform = fn
        def __len__(self):
            return 400
        def __getitem__(self, i):
            return self._format_transform(torch.full((3,), float(i)))
        def __getitems__(self, indices):
            return [self[i] for i in indices]

    class FormattedDataset(HubDataset):
        # The same, its function kept as `transform`: no Compose to open, so it is timed whole.
        def __init__(self, fn):
            self.transform = fn
        def __getitem__(self, i):
            return self.transform(torch.full((3,), float(i)))

    for x in DataLoader(Shards(), batch_size=4):
        pass
    for x in DataLoader(HubDataset(lambda t: t * 2), batch_size=4):
        pass
    for x in DataLoader(FormattedDataset(lambda t: t * 2), batch_size=4):
        pass
""")


def test_loaders_without_transform_rows_say_why_and_leave_their_figures_empty(tmp_path, capsys):
    script, out = tmp_path / "train.py", tmp_path / "out"
    script.write_text(SHARDS)
    assert main(["attach", "--steps", "20", "--skip-steps", "1", "--out", str(out), "--", "python", str(script)]) == 0
    printed = capsys.readouterr().out
    jobs = [read_result(out / f"job-{n}" / "result.json") for n in range(3)]
    # A recipe timed whole, without the load: its rows and figures stand, and the load row's absence is said.
    formatted = jobs.pop()["summary"]
    assert formatted["transforms_note"].startswith("no load row: FormattedDataset fetches its batches itself")
    assert formatted["pipeline_ms_per_sample"] > 0 and formatted["transforms_note"] in printed
    for job, why in zip(jobs, ("an IterableDataset", "fetches its batches itself (__getitems__)")):
        summary = job["summary"]
        assert job["transforms"] == []
        assert summary["pipeline_ms_per_sample"] is None and summary["cpu_ms_per_sample"] is None
        assert why in summary["transforms_note"]
        assert "no transform or transforms" in summary["transforms_note"]
        assert summary["transforms_note"] in printed
    assert "nan" not in printed
    report = (out / REPORT_MD).read_text()
    assert all(job["summary"]["transforms_note"] in report for job in jobs)
    with open(out / "summary.csv", newline="") as table:
        assert [row["pipeline_ms_per_sample"] for row in csv.DictReader(table)][:2] == ["", ""]


def _jpegs(root, count=8, size=160):
    generator = torch.Generator().manual_seed(0)
    for n in range(count):
        folder = root / ("a" if n % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = torch.randint(0, 256, (size, size, 3), dtype=torch.uint8, generator=generator).numpy()
        Image.fromarray(pixels).save(folder / f"{n}.jpg", quality=90)


def test_an_image_folder_decode_gets_its_own_row_out_of_the_load(tmp_path):
    _jpegs(tmp_path / "images")
    dataset = ImageFolder(str(tmp_path / "images"), transform=v2.Compose([v2.PILToTensor()]))
    watched = pipebench.watch(DataLoader(dataset, batch_size=2), steps=6, skip_steps=0)
    for _ in range(2):
        for _ in watched:
            pass
    rows = {row["stage"]: row for row in watched.result().transforms}
    assert rows[DECODE_STAGE]["ms_per_sample"] > 0
    assert "pil_loader" in rows[DECODE_STAGE]["transform"] or "default_loader" in rows[DECODE_STAGE]["transform"]
    assert rows[LOAD_STAGE]["transform"] == "ImageFolder"
    # The loader's own attribute is the user's again once the window is over.
    assert not hasattr(dataset.loader, "clock")


def _stepped(step_s):
    """A watched loader whose loop's step after each batch sleeps the next of `step_s`."""
    watched = pipebench.watch(DataLoader(torch.arange(400.0), batch_size=4), steps=len(step_s), skip_steps=0)
    for n, _ in enumerate(watched):
        if n < len(step_s):
            time.sleep(step_s[n])
    return watched.result()


def test_a_loader_whose_interval_says_nothing_gets_none_and_says_why():
    """One rule on the interval's width (stats.telling), not on its count of blocks (issue 55): three
    steps of 1, 40 and 1 ms make an interval far past 3x of the rate; forty even steps one that is shown."""
    result = _stepped([0.001, 0.04, 0.001])
    assert result.steps_measured == 3
    assert all(value != value for value in (*result.samples_per_s_ci, *result.batches_per_s_ci))
    assert "spread too far" in result.record.summary.ci_note
    assert "nan" not in json.dumps(summary_line(result))
    even = _stepped([0.002] * 40)
    low, high = even.samples_per_s_ci
    assert low <= even.samples_per_s <= high and not even.record.summary.ci_note


def _frame(filename, line, back=None, self=None):
    """A stand-in for a stack frame: what call_site reads of one."""
    return SimpleNamespace(f_code=SimpleNamespace(co_filename=filename), f_lineno=line, f_back=back,
                           f_locals={} if self is None else {"self": self})


LIBS = ("/env/lib/python3.11/site-packages/", "/usr/lib/python3.11/")
PASSED = ("/env/lib/python3.11/site-packages/torch/", "/src/pipebench/")


def test_a_loader_built_inside_a_library_is_named_by_the_users_line_with_the_librarys_beside_it():
    """timm's create_loader (issue 55, attach on real scripts): torch's frames, the library's, the stdlib's runpy, then the script."""
    script = _frame("/home/me/proj/train.py", 120, _frame("<frozen runpy>", 88, _frame("/src/pipebench/cli/attach.py", 9)))
    timm = _frame("/env/lib/python3.11/site-packages/timm/data/loader.py", 467, script)
    torch_init = _frame("/env/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 240, timm)
    assert call_site(torch_init, DataLoader, PASSED, LIBS) == CallSite("train.py:120", "loader.py:467")
    # A subclass's own __init__ is no line of either; a stdlib frame (functools) is no user's line.
    loader = DataLoader(torch.arange(4.0))
    partial = _frame("/usr/lib/python3.11/functools.py", 12, script)
    sub = _frame("/env/lib/python3.11/site-packages/wds/compat.py", 520, partial, self=loader)
    assert call_site(_frame("/src/pipebench/attach/watch.py", 1, sub), DataLoader, PASSED, LIBS) == \
        CallSite("train.py:120", "functools.py:12")
    # The user's own code made it: no library line; -c code is the user's too.
    assert call_site(_frame("/home/me/proj/data.py", 7, script), DataLoader, PASSED, LIBS) == CallSite("data.py:7")
    assert call_site(_frame("<string>", 1), DataLoader, PASSED, LIBS) == CallSite("<string>:1")
    # Nothing of the user's on the stack (python -m a library's own trainer): the library's line alone.
    assert call_site(timm.__class__(**{**vars(timm), "f_back": None}), DataLoader, PASSED, LIBS) == \
        CallSite("loader.py:467")
    assert call_site(None, DataLoader, PASSED, LIBS) == CallSite(UNKNOWN_SITE)
    # A dist-packages folder is installed code wherever it sits.
    assert not user_code("/opt/conda/envs/x/lib/python3.11/dist-packages/webdataset/compat.py", ())


def test_the_library_line_is_a_pair_of_the_loaders_name():
    identity = LoaderIdentity("train.py:120", "ImageDataset[50000]", "train.py:880", 2, "loader.py:467")
    assert identity.label == ("loader=train.py:120,via=loader.py:467,iterated=train.py:880,"
                              "dataset=ImageDataset[50000],created=2")
    assert LoaderIdentity("train.py:57", "X[3]").label == "loader=train.py:57,dataset=X[3]"
