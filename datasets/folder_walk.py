"""The walk of an image folder: every image once, links followed, loops and odd files skipped and counted.

Links are followed, as torchvision's ImageFolder follows them, so a folder of links to images
stored elsewhere works. But each real folder is walked once, known by its device and inode: a
link back up the tree (`loop -> ..`) or a second link to one folder would otherwise repeat its
images (once a level) or never end. Real folders are walked before any link, so a link to a
folder inside the tree is the one skipped, and its images keep the label of where they live.

An entry named like an image that is not a regular file (a FIFO, a socket, a device, a link to
one such as `/dev/zero`, or a dangling link) holds no image, and reading it may never end: it is
skipped. Hidden files and folders are skipped too, as before: they are usually metadata (macOS
`._x.jpg`), not images. A folder the walk cannot open (a `lost+found` of another user) is skipped.
Each kind of skip is counted and named, for the dataset's note and its identity.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Deque, List, Set, Tuple

from .lazy_image import IMAGE_EXTENSIONS

__all__ = ["FolderWalk", "walk_images"]


@dataclass(frozen=True)
class FolderWalk:
    """What a walk of one root found: the images, and each kind of entry it skipped. Every path is
    relative to the root, in POSIX form, sorted."""

    images: Tuple[str, ...]
    # Folders reached a second time (through a link, or a bind mount): their images are already in.
    repeated_folders: Tuple[str, ...]
    # Image-named entries that are no regular file: FIFOs, sockets, devices, dangling links.
    not_regular: Tuple[str, ...]
    # Folders that could not be listed, links that could not be followed (permission denied, gone),
    # each with the system's reason.
    unreadable: Tuple[str, ...]

    def skipped_counts(self) -> dict:
        """How many of each kind were skipped; empty when none was."""
        counts = {"repeated_folders": len(self.repeated_folders), "not_regular_files": len(self.not_regular),
                  "unreadable": len(self.unreadable)}
        return counts if any(counts.values()) else {}

    def skipped_line(self) -> str:
        """One line saying what was skipped and why, naming the first of each kind; '' when nothing was."""
        parts = []
        if self.repeated_folders:
            parts.append(f"{_count(len(self.repeated_folders), 'link')} to folders already walked (a loop such as "
                         f"`loop -> ..`, or a second link or mount of one folder: each folder is read once; first: "
                         f"{self.repeated_folders[0]})")
        if self.not_regular:
            parts.append(f"{_count(len(self.not_regular), 'image name')} on no regular file, not read (a FIFO, "
                         f"socket, device or dangling link holds no image; first: {self.not_regular[0]})")
        if self.unreadable:
            parts.append(f"{_count(len(self.unreadable), 'entry', 'entries')} it cannot open "
                         f"(first: {self.unreadable[0]})")
        return "skipped " + "; ".join(parts) if parts else ""


def _count(n: int, noun: str, plural: str = "") -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def walk_images(root: Path) -> FolderWalk:
    """Walk `root` breadth first, real folders before links (see the module doc)."""
    seen: Set[Tuple[int, int]] = set()
    images: List[str] = []
    repeated: List[str] = []
    not_regular: List[str] = []
    unreadable: List[str] = []
    # Folders to walk, by path relative to root ("" is root): real ones first, links after all of them.
    real: Deque[str] = deque([""])
    linked: Deque[str] = deque()
    while real or linked:
        rel = real.popleft() if real else linked.popleft()
        folder = root / rel
        try:
            info = folder.stat()
            if (info.st_dev, info.st_ino) in seen:
                repeated.append(rel)
                continue
            seen.add((info.st_dev, info.st_ino))
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            unreadable.append(f"{rel or '.'} ({exc.strerror or exc})")
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = f"{rel}/{entry.name}" if rel else entry.name
            try:
                if entry.is_dir():  # follows a link
                    (linked if entry.is_symlink() else real).append(path)
                elif os.path.splitext(entry.name)[1].lower() in IMAGE_EXTENSIONS:
                    # A regular file, or a link to one; anything else is no image.
                    (images if entry.is_file() else not_regular).append(path)
            except OSError as exc:  # a link whose target this user may not look at
                unreadable.append(f"{path} ({exc.strerror or exc})")
    return FolderWalk(tuple(sorted(images)), tuple(sorted(repeated)), tuple(sorted(not_regular)),
                      tuple(sorted(unreadable)))
