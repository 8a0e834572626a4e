"""`pip install -e .` is how contributors install; `pipebench run` must then work from any directory.

Hydra finds launcher plugins by scanning `hydra_plugins.__path__`, which setuptools' editable
finder does not extend, so the CLI registers its launcher itself. This test makes a real editable
install in a fresh venv, and runs a job from a folder outside the repository.
"""

import site
import subprocess
import venv
from pathlib import Path

import pytest
from conftest import FAST_JOB, NO_CHAIN, results_folder

REPO = Path(__file__).resolve().parents[1]
# What the running environment's own pipebench install left in site-packages; the fresh venv
# must see none of it, or it would import that copy instead of the editable one.
OWN_INSTALL = ("pipebench", "__editable__", "__editable___pipebench")
LAUNCHER_PACKAGE = "pipebench_launcher"


def _view_of_dependencies(view: Path) -> None:
    """A folder of links to this environment's packages (torch, hydra, ...) without pipebench's own."""
    # Debian's Python lists a venv's local/lib/.../dist-packages among them whether or not it exists.
    for packages in filter(Path.is_dir, map(Path, site.getsitepackages())):
        for entry in packages.iterdir():
            if entry.name.startswith(OWN_INSTALL) or (view / entry.name).exists():
                continue
            if entry.name == "hydra_plugins":
                (view / entry.name).mkdir()
                for plugin in entry.iterdir():
                    if plugin.name != LAUNCHER_PACKAGE:
                        (view / entry.name / plugin.name).symlink_to(plugin)
                continue
            (view / entry.name).symlink_to(entry)


@pytest.mark.slow
def test_editable_install_runs_a_job_from_another_directory(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    view = tmp_path / "deps"
    view.mkdir()
    _view_of_dependencies(view)
    python = env_dir / "bin" / "python"
    own_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    (Path(own_site) / "deps.pth").write_text(f"{view}\n")
    install = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                              "-e", str(REPO)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-2000:]
    where = subprocess.run([str(python), "-c", "import pipebench; print(pipebench.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert where.stdout.strip() == str(REPO / "pipebench" / "__init__.py"), where.stdout + where.stderr
    # Benchmarks compose configs without the CLI, which is what registers the launcher plugin.
    composed = subprocess.run([str(python), "-c", "from pipebench.config.compose import compose_job_spec; "
                               "print(compose_job_spec(['workers=2']).workers)"],
                              capture_output=True, text=True, cwd=tmp_path)
    assert composed.stdout.strip() == "2", composed.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run([str(env_dir / "bin" / "pipebench"), "run", "workers=0", *FAST_JOB, *NO_CHAIN,
                          "results_dir=out"], capture_output=True, text=True, cwd=elsewhere, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (elsewhere / results_folder(run.stdout) / "summary.csv").is_file()
