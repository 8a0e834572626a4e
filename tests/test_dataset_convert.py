"""`dataset convert` before it writes: a format whose library is missing is one pip line, and nothing
is created (a full disk while it writes is in test_full_disk.py)."""

import pytest

from pipebench.base.errors import DatasetError
from pipebench.cli.dataset import FORMATS, convert
from pipebench.datasets import shard_split


@pytest.mark.parametrize("to", sorted(FORMATS))
def test_convert_without_the_extra_is_one_pip_line_and_creates_no_folder(to, monkeypatch, tmp_path):
    monkeypatch.setattr(shard_split, "installed", lambda module: False)
    out = tmp_path / "new" / "out"
    with pytest.raises(DatasetError) as missing:
        convert(to, out, 4, [])
    assert str(missing.value).startswith(f"dataset convert --to {to} needs ") and "formats]" in str(missing.value)
    assert list(tmp_path.iterdir()) == [], "no --out folder, no parent of it"
