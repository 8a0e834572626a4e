"""Tests of the dataset catalogue: lazy decoding, the synthetic JPEG cache, image
folders, random tensors, and the contract every dataset keeps (identity, pickling)."""

import hashlib
import json
import os
import pickle
import time

import numpy as np
import pytest
import torch
from PIL import Image

from pipebench.base.errors import DatasetError
from pipebench.datasets import synthetic_jpeg
from pipebench.datasets.image_folder import ImageFolderDataset
from pipebench.datasets.lazy_image import IMAGE_EXTENSIONS, open_rgb
from pipebench.datasets.random_tensors import RandomTensorDataset
from pipebench.datasets.synthetic_jpeg import SyntheticJpegDataset
from pipebench.storage.dataset_contract import DatasetContract, told

# Small pictures keep the cache builds in these tests to a few milliseconds each.
SMALL = dict(num_images=6, width=48, height=32)


def small_synthetic(tmp_path, **overrides):
    params = dict(SMALL, length=20, cache_dir=tmp_path / "cache")
    params.update(overrides)
    return SyntheticJpegDataset(**params)


def is_decoded(img: Image.Image) -> bool:
    """Pillow keeps the undecoded tile list until load() runs the decoder."""
    return not img.tile


def assert_one_line_naming(exc_info, *parts):
    message = str(exc_info.value)
    assert "\n" not in message
    for part in parts:
        assert str(part) in message


def write_image(path, mode="RGB", size=(24, 16), color=(200, 30, 60), fmt=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path, fmt)
    return path


def file_state(folder):
    """(name, size, mtime_ns) of every file under folder, to detect any rewrite."""
    return sorted(
        (str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*") if p.is_file()
    )


# --- lazy_image -------------------------------------------------------------------


def test_rgb_jpeg_is_returned_undecoded_and_decodes_on_first_pixel_access(tmp_path):
    path = write_image(tmp_path / "a.jpg")
    img = open_rgb(path)
    assert img.mode == "RGB"
    assert not is_decoded(img)
    img.getpixel((0, 0))
    assert is_decoded(img)


@pytest.mark.parametrize(
    "name, mode, color, expected",
    [
        ("gray.jpg", "L", 77, (77, 77, 77)),
        ("cmyk.jpg", "CMYK", (0, 0, 0, 0), (255, 255, 255)),
        ("alpha.png", "RGBA", (10, 200, 30, 128), (10, 200, 30)),
    ],
)
def test_non_rgb_files_come_back_rgb(tmp_path, name, mode, color, expected):
    path = write_image(tmp_path / name, mode=mode, color=color)
    assert Image.open(path).mode == mode
    img = open_rgb(path)
    assert img.mode == "RGB"
    # JPEG is lossy: allow a few grey levels.
    assert np.abs(np.asarray(img, np.int16) - np.array(expected)).max() <= 3


def test_palette_png_comes_back_rgb_with_its_colours(tmp_path):
    indices = np.array([[0, 1], [1, 0]], np.uint8)
    img = Image.fromarray(indices, mode="P")
    img.putpalette([255, 0, 0, 0, 0, 255] + [0] * (256 - 2) * 3)
    img.save(tmp_path / "p.png")
    rgb = open_rgb(tmp_path / "p.png")
    assert rgb.mode == "RGB"
    assert rgb.getpixel((0, 0)) == (255, 0, 0)
    assert rgb.getpixel((1, 0)) == (0, 0, 255)


def test_extensions_are_lower_case_with_dot():
    assert {".jpg", ".jpeg", ".png"} <= IMAGE_EXTENSIONS
    assert all(e.startswith(".") and e == e.lower() for e in IMAGE_EXTENSIONS)


# --- synthetic_jpeg ---------------------------------------------------------------


def test_synthetic_samples_are_lazy_rgb_of_the_asked_size(tmp_path):
    ds = small_synthetic(tmp_path)
    img, label = ds[3]
    assert img.mode == "RGB" and img.size == (48, 32)
    assert not is_decoded(img)
    assert np.asarray(img).shape == (32, 48, 3)
    assert is_decoded(img)
    assert isinstance(label, int)


def test_synthetic_default_size_is_the_seed_photo_size(tmp_path):
    ds = SyntheticJpegDataset(num_images=1, cache_dir=tmp_path)
    img, _ = ds[0]
    assert img.size == (533, 800)
    # Photo-like, not a flat picture that compresses to nothing (nor noise).
    assert 50_000 < os.path.getsize(ds.describe(0)) < 400_000


def test_synthetic_images_are_distinct_and_cycled(tmp_path):
    ds = small_synthetic(tmp_path)
    paths = [ds.describe(i) for i in range(SMALL["num_images"])]
    digests = {hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths}
    assert len(digests) == SMALL["num_images"]
    assert ds.describe(2) == ds.describe(2 + SMALL["num_images"])
    assert ds.describe(-1) == ds.describe(len(ds) - 1)


def test_synthetic_pictures_are_colourful(tmp_path):
    pixels = np.asarray(small_synthetic(tmp_path)[0][0], np.float32)
    channel_spread = pixels.max(axis=2) - pixels.min(axis=2)
    assert channel_spread.mean() > 30  # not grey
    assert pixels.std(axis=(0, 1)).min() > 20  # not flat


def test_synthetic_cache_is_built_once(tmp_path, monkeypatch):
    first = small_synthetic(tmp_path)
    before = file_state(first.cache_path)
    monkeypatch.setattr(synthetic_jpeg, "draw_picture", None)  # any redraw would fail
    second = small_synthetic(tmp_path, length=50, num_classes=3)  # same images
    assert second.cache_path == first.cache_path
    assert file_state(second.cache_path) == before
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.cache_path.name]


def test_synthetic_cache_dir_override_and_xdg_default(tmp_path, monkeypatch):
    ds = small_synthetic(tmp_path)
    assert ds.cache_path.parent == tmp_path / "cache"
    assert ds.describe(0).startswith(str(tmp_path / "cache"))

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    ds = SyntheticJpegDataset(**SMALL)
    assert ds.cache_path.parent == tmp_path / "xdg" / "pipebench" / "synthetic_jpeg"
    assert os.path.exists(ds.describe(0))


def test_synthetic_cache_depends_on_image_params_only(tmp_path):
    base = small_synthetic(tmp_path)
    assert small_synthetic(tmp_path, seed=1).cache_path != base.cache_path
    assert small_synthetic(tmp_path, quality=50).cache_path != base.cache_path
    assert small_synthetic(tmp_path, length=7, num_classes=2).cache_path == base.cache_path


def test_synthetic_build_tolerates_losing_the_race(tmp_path, monkeypatch):
    real_rename = os.rename
    raced = []

    def rename_after_a_rival(src, dst):
        if not raced:  # a rival process finishes its build first
            raced.append(True)
            small_synthetic(tmp_path)
        return real_rename(src, dst)

    monkeypatch.setattr(synthetic_jpeg.os, "rename", rename_after_a_rival)
    ds = small_synthetic(tmp_path)
    assert raced
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [ds.cache_path.name]  # no temp left
    assert np.asarray(ds[0][0]).shape == (32, 48, 3)


def test_synthetic_damaged_cache_is_a_one_line_error(tmp_path):
    ds = small_synthetic(tmp_path)
    os.remove(ds.describe(1))
    with pytest.raises(DatasetError) as exc_info:
        small_synthetic(tmp_path)
    assert_one_line_naming(exc_info, ds.cache_path)


def test_synthetic_labels_in_range_deterministic_and_varied(tmp_path):
    ds = small_synthetic(tmp_path, length=500, num_classes=7)
    labels = [ds[i][1] for i in range(len(ds))]
    assert set(labels) == set(range(7))
    again = small_synthetic(tmp_path, length=500, num_classes=7)
    assert [again[i][1] for i in range(len(again))] == labels
    other = small_synthetic(tmp_path, length=500, num_classes=7, seed=1)
    assert [other[i][1] for i in range(len(other))] != labels


@pytest.mark.parametrize(
    "key, value",
    [
        ("length", 0), ("num_images", 0), ("width", 0), ("height", -3),
        ("quality", 0), ("quality", 96), ("num_classes", 0), ("seed", -1),
        ("length", 2.5), ("width", "533"), ("num_images", True),
    ],
)
def test_synthetic_rejects_bad_args(tmp_path, key, value):
    with pytest.raises(DatasetError) as exc_info:
        small_synthetic(tmp_path, **{key: value})
    assert_one_line_naming(exc_info, key)
    assert not (tmp_path / "cache").exists()


def test_synthetic_index_out_of_range(tmp_path):
    ds = small_synthetic(tmp_path)
    with pytest.raises(IndexError):
        ds[len(ds)]


# --- image_folder -----------------------------------------------------------------


def test_image_folder_missing_path_is_a_one_line_error(tmp_path):
    with pytest.raises(DatasetError) as exc_info:
        ImageFolderDataset(tmp_path / "nowhere")
    assert_one_line_naming(exc_info, tmp_path / "nowhere", "does not exist")


def test_image_folder_file_instead_of_folder(tmp_path):
    path = write_image(tmp_path / "a.jpg")
    with pytest.raises(DatasetError) as exc_info:
        ImageFolderDataset(path)
    assert_one_line_naming(exc_info, path, "not a directory")


def test_image_folder_without_images(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "notes.txt").write_text("not an image")
    write_image(tmp_path / ".hidden.jpg")
    with pytest.raises(DatasetError) as exc_info:
        ImageFolderDataset(tmp_path)
    assert_one_line_naming(exc_info, tmp_path, "no images")


def test_image_folder_class_subfolders_give_labels(tmp_path):
    write_image(tmp_path / "dog" / "b.png", fmt="PNG")
    write_image(tmp_path / "dog" / "deeper" / "c.JPG", fmt="JPEG")
    write_image(tmp_path / "cat" / "a.jpeg")
    write_image(tmp_path / "cat" / "z.bmp")
    (tmp_path / "cat" / "readme.txt").write_text("skipped")
    (tmp_path / "empty").mkdir()
    ds = ImageFolderDataset(tmp_path)
    assert ds.classes == ["cat", "dog"] and ds.num_classes == 2
    names = [os.path.relpath(ds.describe(i), tmp_path) for i in range(len(ds))]
    assert names == ["cat/a.jpeg", "cat/z.bmp", "dog/b.png", "dog/deeper/c.JPG"]
    assert [ds[i][1] for i in range(len(ds))] == [0, 0, 1, 1]
    img, _ = ds[3]
    assert img.mode == "RGB" and not is_decoded(img)


def test_image_folder_flat_gets_seeded_random_labels(tmp_path):
    for k in range(60):
        write_image(tmp_path / "sub" / f"{k:02d}.png", size=(2, 2), fmt="PNG")
    write_image(tmp_path / "top.png", size=(2, 2), fmt="PNG")  # not all in subfolders
    ds = ImageFolderDataset(tmp_path, num_classes=4, seed=3)
    assert ds.classes is None and ds.num_classes == 4
    labels = [ds[i][1] for i in range(len(ds))]
    assert set(labels) == {0, 1, 2, 3}
    assert [ImageFolderDataset(tmp_path, num_classes=4, seed=3)[i][1] for i in range(len(ds))] == labels
    assert [ImageFolderDataset(tmp_path, num_classes=4, seed=4)[i][1] for i in range(len(ds))] != labels


def test_image_folder_identity_tracks_files(tmp_path):
    write_image(tmp_path / "a.png", fmt="PNG")
    first = ImageFolderDataset(tmp_path).identity()
    assert ImageFolderDataset(tmp_path).identity() == first
    write_image(tmp_path / "b.png", fmt="PNG")
    assert ImageFolderDataset(tmp_path).identity()["content_digest"] != first["content_digest"]
    assert ImageFolderDataset(tmp_path, seed=1).identity() != ImageFolderDataset(tmp_path).identity()


# --- image_folder: links, loops and entries that are no image file -----------------------
# The walk follows links but each real folder once (datasets/folder_walk.py); what it skips is
# counted in identity() and said in one note line, which each job prints on stderr.

# Each walk below ends this fast; before folders were known by device and inode, two loops made it
# exponential (a minute and more for 8 images).
WALK_BOUND_S = 2.0


def eight_images(root):
    """Two class folders of four images each, as in the issue's report."""
    for label in ("a", "b"):
        for k in range(4):
            write_image(root / label / f"{k}.jpg", color=(k * 40, 0, 0))
    return root


def walked(root):
    """The dataset over root, its relative names, the skip counts and the notes a job prints of it."""
    start = time.monotonic()
    ds = ImageFolderDataset(root)
    assert time.monotonic() - start < WALK_BOUND_S
    names = [os.path.relpath(ds.describe(i), root.resolve()) for i in range(len(ds))]
    return ds, names, ds.identity().get("skipped", {}), ds.notes()


def test_image_folder_walks_a_folder_linked_back_up_once(tmp_path):
    root = eight_images(tmp_path / "imgs")
    os.symlink("..", root / "a" / "loop")
    ds, names, skipped, notes = walked(root)
    assert len(ds) == 8 and len(set(names)) == 8
    assert skipped == {"repeated_folders": 1, "not_regular_files": 0, "unreadable": 0}
    assert len(notes) == 1 and notes[0].startswith(f"image_folder: {root}: skipped ")
    assert "skipped 1 link to folders already walked" in notes[0] and "first: a/loop" in notes[0]


def test_image_folder_with_two_loops_ends_at_once(tmp_path):
    root = eight_images(tmp_path / "imgs")
    os.symlink("..", root / "a" / "loop")
    os.symlink("..", root / "b" / "loop")
    ds, _, skipped, notes = walked(root)
    assert len(ds) == 8 and skipped["repeated_folders"] == 2 and len(notes) == 1


def test_image_folder_link_to_a_file_in_the_tree_is_a_sample_of_its_own(tmp_path):
    """A file link is the user's own labelling (the same picture under another class, as torchvision's
    ImageFolder reads it); only folders repeat themselves, so only folders are walked once."""
    root = eight_images(tmp_path / "imgs")
    os.symlink("../a/0.jpg", root / "b" / "also.jpg")
    ds, names, skipped, notes = walked(root)
    assert len(ds) == 9 and "b/also.jpg" in names
    assert ds[names.index("b/also.jpg")][1] == ds.classes.index("b")
    assert skipped == {} and notes == ()


def test_image_folder_follows_a_link_to_an_outside_folder_once(tmp_path):
    root = eight_images(tmp_path / "imgs")
    write_image(tmp_path / "elsewhere" / "x.jpg")
    os.symlink(tmp_path / "elsewhere", root / "a" / "more")
    os.symlink(tmp_path / "elsewhere", root / "b" / "more")  # a second way to the same folder
    os.symlink(root, tmp_path / "elsewhere" / "back")  # and from there back into the tree
    ds, names, skipped, notes = walked(root)
    assert len(ds) == 9 and names.count("a/more/x.jpg") == 1 and not any("b/more" in n for n in names)
    assert skipped["repeated_folders"] == 2 and len(notes) == 1 and "first: a/more/back" in notes[0]


def test_image_folder_walks_the_real_folder_and_skips_a_link_to_it(tmp_path):
    """A link to a folder inside the tree is the one skipped, even where its name sorts first: the
    images keep the label of the folder they live in."""
    root = eight_images(tmp_path / "imgs")
    os.symlink("b", root / "0_alias")
    ds, names, skipped, notes = walked(root)
    assert ds.classes == ["a", "b"] and not any(n.startswith("0_alias") for n in names)
    assert skipped["repeated_folders"] == 1 and "first: 0_alias" in notes[0]


def test_image_folder_skips_a_fifo_and_a_dev_zero_link_named_like_images(tmp_path):
    """Neither holds an image, and reading one never ends (the FIFO has no writer; /dev/zero no end)."""
    root = eight_images(tmp_path / "imgs")
    os.mkfifo(root / "a" / "pipe.jpg")
    os.symlink("/dev/zero", root / "b" / "zero.jpg")
    os.symlink(tmp_path / "gone.jpg", root / "b" / "dangling.jpg")
    ds, names, skipped, notes = walked(root)
    assert len(ds) == 8 and not any(n.endswith(("pipe.jpg", "zero.jpg", "dangling.jpg")) for n in names)
    assert skipped == {"repeated_folders": 0, "not_regular_files": 3, "unreadable": 0}
    assert len(notes) == 1 and "3 image names on no regular file, not read" in notes[0] and "first: a/pipe.jpg" in notes[0]


def test_image_folder_skips_a_link_it_cannot_follow(tmp_path):
    root = eight_images(tmp_path / "imgs")
    os.symlink("self", root / "self")  # stat() fails with "Too many levels of symbolic links"
    ds, _, skipped, notes = walked(root)
    assert len(ds) == 8 and skipped["unreadable"] == 1 and "first: self (Too many levels" in notes[0]


def test_image_folder_of_only_odd_entries_says_what_it_skipped(tmp_path):
    os.mkfifo(tmp_path / "pipe.jpg")
    with pytest.raises(DatasetError) as exc_info:
        ImageFolderDataset(tmp_path)
    assert_one_line_naming(exc_info, tmp_path, "no images", "skipped 1 image name on no regular file")


# --- random_tensors ---------------------------------------------------------------


def test_random_tensors_shape_dtype_and_cycling():
    ds = RandomTensorDataset(shape=[3, 8, 5], length=10, num_distinct=4)
    x, label = ds[1]
    assert x.shape == (3, 8, 5) and x.dtype == torch.uint8
    assert isinstance(label, int) and 0 <= label < 10
    assert torch.equal(ds[1][0], ds[5][0])
    assert not torch.equal(ds[1][0], ds[2][0])
    assert len(ds) == 10


def test_random_tensors_samples_are_independent_clones():
    ds = RandomTensorDataset(shape=(3, 4, 4), length=8, num_distinct=2)
    original = ds[0][0].clone()
    sample = ds[0][0]
    sample.zero_()
    assert torch.equal(ds[0][0], original)
    assert torch.equal(ds[2][0], original)


def test_random_tensors_are_seeded():
    a = RandomTensorDataset(shape=(2, 3), length=50, seed=5)
    b = RandomTensorDataset(shape=(2, 3), length=50, seed=5)
    c = RandomTensorDataset(shape=(2, 3), length=50, seed=6)
    assert all(torch.equal(a[i][0], b[i][0]) and a[i][1] == b[i][1] for i in range(50))
    assert not all(torch.equal(a[i][0], c[i][0]) for i in range(50))


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(shape=[3, 0, 4]), "shape"),
        (dict(shape=[]), "shape"),
        (dict(shape="3x4"), "shape"),
        (dict(shape=[3, 4.5]), "shape"),
        (dict(length=0), "length"),
        (dict(num_distinct=0), "num_distinct"),
        (dict(num_classes=0), "num_classes"),
    ],
)
def test_random_tensors_reject_bad_args(kwargs, key):
    with pytest.raises(DatasetError) as exc_info:
        RandomTensorDataset(**kwargs)
    assert_one_line_naming(exc_info, key)


def test_random_tensors_pool_is_not_pickled():
    ds = RandomTensorDataset(shape=(3, 64, 64), length=10, num_distinct=32)
    ds[0]
    assert len(pickle.dumps(ds)) < 3 * 64 * 64 * 32 // 10


# --- the contract every dataset keeps ---------------------------------------------


@pytest.fixture(params=["synthetic_jpeg", "image_folder", "random_tensors"])
def make_dataset(request, tmp_path):
    """A factory building one kind of dataset with keyword overrides."""
    if request.param == "synthetic_jpeg":
        return lambda **kw: small_synthetic(tmp_path, **kw)
    if request.param == "image_folder":
        for k in range(5):
            write_image(tmp_path / "imgs" / f"{k}.jpg", color=(k * 40, 0, 0))
        return lambda **kw: ImageFolderDataset(tmp_path / "imgs", **kw)
    return lambda **kw: RandomTensorDataset(shape=(3, 6, 6), length=20, **kw)


def test_identity_is_json_and_follows_params(make_dataset):
    identity = make_dataset().identity()
    assert json.loads(json.dumps(identity)) == identity
    assert identity["name"] and identity["content_digest"]
    assert make_dataset().identity() == identity
    assert make_dataset(seed=1).identity() != identity
    assert make_dataset(num_classes=3).identity() != identity


def test_describe_names_each_sample(make_dataset):
    ds = make_dataset()
    assert all(isinstance(ds.describe(i), str) and ds.describe(i) for i in range(len(ds)))


def test_pickle_round_trip(make_dataset):
    ds = make_dataset()
    copy = pickle.loads(pickle.dumps(ds))
    assert len(copy) == len(ds)
    assert copy.identity() == ds.identity()
    for i in range(len(ds)):
        (a, label_a), (b, label_b) = ds[i], copy[i]
        assert label_a == label_b
        assert np.array_equal(np.asarray(a), np.asarray(b))
        assert copy.describe(i) == ds.describe(i)


def collate_to_arrays(batch):
    """Module-level, so spawned workers can import it by name."""
    return [(np.asarray(sample), label) for sample, label in batch]


@pytest.mark.slow
def test_spawned_workers_load_the_same_samples(tmp_path):
    ds = small_synthetic(tmp_path)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, num_workers=1, multiprocessing_context="spawn",
        collate_fn=collate_to_arrays,
    )
    loaded = [item for batch in loader for item in batch]
    assert len(loaded) == len(ds)
    for i, (pixels, label) in enumerate(loaded):
        assert label == ds[i][1]
        assert np.array_equal(pixels, np.asarray(ds[i][0]))


def test_every_reader_asks_the_contract_and_a_users_dataset_keeps_what_it_defines():
    """A catalogue dataset keeps the whole contract; a user's own keeps its members, the rest default."""
    tensors = RandomTensorDataset(length=4)
    assert isinstance(tensors, DatasetContract) and told(tensors) is tensors
    assert told(tensors).files() == [] and told(tensors).identity()["name"] == "random_tensors"

    class Own:
        def describe(self, index):
            return f"row {index}"

    own = told(Own())
    assert own.describe(2) == "row 2" and own.identity() == {"class": "Own"}
    assert (own.notes(), own.files(), own.plan_notes(), own.plan_warnings(None)) == ((), [], (), ())
