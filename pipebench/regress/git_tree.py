"""The git side of an A/B session: resolve a ref, check it out in a temporary worktree, tell a
dirty tree. Every failure is a GitError, one line naming the ref or the repository."""

import shutil
import subprocess
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator, List

from pipebench.base.errors import PipebenchError

# git answers these in milliseconds; a minute covers a cold worktree checkout of a big repository.
GIT_TIMEOUT_S = 60


class GitError(PipebenchError):
    """Not a git repository, a ref that names no commit, a dirty tree where a clean one is needed."""


def git(repo: Path, *args: str) -> str:
    """Run `git -C repo args` and return its stdout, stripped; GitError with git's own first line."""
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                             timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitError(f"git {args[0]} failed: {exc}") from exc
    if out.returncode != 0:
        first = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[0]
        raise GitError(f"git {args[0]}: {first}")
    return out.stdout.strip()


def repo_root(path: Path) -> Path:
    try:
        return Path(git(path, "rev-parse", "--show-toplevel"))
    except GitError:
        raise GitError(f"{path}: not inside a git repository (A/B checks refs out of one)") from None


def resolve_commit(repo: Path, ref: str) -> str:
    """The full commit id `ref` names; GitError naming the ref when it names none."""
    if not ref or ref.startswith("-"):
        raise GitError(f"{ref!r} is not a git ref")
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except GitError:
        raise GitError(f"{ref!r}: no such commit in {repo}") from None


def dirty_paths(repo: Path) -> List[str]:
    """Tracked files with uncommitted changes (untracked and ignored files, e.g. results/, don't count)."""
    return [line[3:] for line in git(repo, "status", "--porcelain", "--untracked-files=no").splitlines()]


@contextmanager
def checked_out(repo: Path, commit: str) -> Iterator[Path]:
    """A detached worktree of `commit` in a temporary folder, removed (and unregistered) on exit."""
    parent = Path(tempfile.mkdtemp(prefix="pipebench-ab-"))
    tree = parent / commit[:12]
    git(repo, "worktree", "add", "--detach", "--quiet", str(tree), commit)
    try:
        yield tree
    finally:
        with suppress(GitError):
            git(repo, "worktree", "remove", "--force", str(tree))
        shutil.rmtree(parent, ignore_errors=True)
        with suppress(GitError):
            git(repo, "worktree", "prune")
