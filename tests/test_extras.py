"""A feature whose library is missing names every missing extra in one pip line, in the form that
matches how pipebench was installed (PEP 610's direct_url.json, simulated here by a dist-info folder)."""

import json
from importlib.metadata import PathDistribution

import pytest

from pipebench.base import extras
from pipebench.base.extras import MissingExtra, install_line, missing_line

CLONE = "/home/me/pipebench"
THREADS = MissingExtra("loader.backend=threads", "torchdata", "threads")
SPDL = MissingExtra("loader.backend=spdl", "spdl", "spdl")


@pytest.fixture
def installed_as(tmp_path, monkeypatch):
    """Make pipebench look installed with this direct_url.json (None: from an index, which writes none),
    behind a source tree's egg-info that has none, as a clone's working directory puts it first."""
    def install(direct_url):
        egg = tmp_path / "pipebench.egg-info"
        egg.mkdir()
        (egg / "PKG-INFO").write_text("Name: pipebench\nVersion: 0.1.0\n")
        info = tmp_path / "site" / "pipebench-0.1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Name: pipebench\nVersion: 0.1.0\n")
        if direct_url is not None:
            (info / "direct_url.json").write_text(json.dumps(direct_url))
        monkeypatch.setattr(extras, "distributions", lambda name: [PathDistribution(egg), PathDistribution(info)])
    return install


def test_from_a_clone_the_line_installs_the_clone_with_every_extra(installed_as, monkeypatch):
    installed_as({"url": f"file://{CLONE}", "dir_info": {}})
    monkeypatch.chdir("/")
    assert install_line(["threads", "spdl"]) == f'pip install "{CLONE}[threads,spdl]"'
    assert missing_line([THREADS, SPDL]) == ("loader.backend=threads needs torchdata; loader.backend=spdl needs spdl: "
                                             f'pip install "{CLONE}[threads,spdl]"')


def test_inside_the_clone_it_is_dot_and_an_editable_install_stays_editable(installed_as, tmp_path, monkeypatch):
    clone = tmp_path / "clone"
    clone.mkdir()
    installed_as({"url": clone.as_uri(), "dir_info": {"editable": True}})
    monkeypatch.chdir(clone)
    assert install_line(["threads", "spdl", "threads"]) == 'pip install -e ".[threads,spdl]"'


def test_from_an_index_the_line_names_the_package(installed_as):
    installed_as(None)
    assert install_line(["threads", "spdl"]) == 'pip install "pipebench[threads,spdl]"'
    assert missing_line([THREADS, SPDL]).endswith(': pip install "pipebench[threads,spdl]"')


def test_from_a_git_url_the_line_names_the_url(installed_as):
    installed_as({"url": "https://example.org/pipebench.git", "vcs_info": {"vcs": "git", "commit_id": "ab12"}})
    assert install_line(["decode"]) == 'pip install "pipebench[decode] @ git+https://example.org/pipebench.git"'


def test_features_needing_one_library_share_its_name(installed_as):
    installed_as(None)
    region = [MissingExtra(move, "nvImageCodec", "decode") for move in ("region_decode", "gpu_region_decode")]
    assert missing_line(region) == 'region_decode, gpu_region_decode need nvImageCodec: pip install "pipebench[decode]"'
