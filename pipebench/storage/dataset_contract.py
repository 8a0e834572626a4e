"""What a dataset tells pipebench besides its samples: the dataset contract, as `Consumer`,
`LoaderBackend` and `Meter` are the other parts' contracts.

A catalogue dataset subclasses `DatasetContract` and so keeps all of it, with the defaults of a
dataset that has nothing to say. A user's own dataset keeps what it likes without subclassing
(`describe(i)` and `identity()`, say: docs/configs.md), so every reader asks `told(dataset)`, which
answers each member the dataset lacks with the default. It sits in storage, the lowest room that reads
a dataset: the page cache warms its `files()`. Nothing here imports torch.
"""

from typing import Any, Dict, List, Protocol, Tuple, runtime_checkable

from pipebench.config.specs import JobSpec

__all__ = ["CONTRACT_MEMBERS", "DatasetContract", "told"]

# The members a dataset may keep; `told` takes each one a dataset has as its own.
CONTRACT_MEMBERS = ("identity", "describe", "notes", "files", "store_urls", "plan_notes", "plan_warnings")


@runtime_checkable
class DatasetContract(Protocol):
    def identity(self) -> Dict[str, Any]:
        """result.json's fingerprint of the data (its class, and what the dataset says: size, digest)."""
        return {"class": type(self).__name__}

    def describe(self, index: int) -> str:
        """Sample `index` as a failure line names it: its file, or its shard and place in it."""
        return f"sample {index}"

    def notes(self) -> Tuple[str, ...]:
        """What the build left out of what it was given (an image folder's loops), warned as a job starts."""
        return ()

    def files(self) -> List[str]:
        """The local files it reads: what the page-cache warm-up reads and a conversion takes."""
        return []

    def store_urls(self) -> List[str]:
        """The object-store URLs it reads, which no local page cache holds (pipebench.storage.object_store)."""
        return []

    def plan_notes(self) -> Tuple[str, ...]:
        """Before any job runs: what its build found about how it reads (a LitData set of decoded images)."""
        return ()

    def plan_warnings(self, spec: JobSpec) -> Tuple[str, ...]:
        """Before any job runs: what a job reading it as `spec` says would cost it (readers left without a
        shard, shuffled reads of whole row groups), nothing measured yet."""
        return ()


class _Partial(DatasetContract):
    """A dataset that keeps part of the contract, or none: its own members, the defaults for the rest."""

    def __init__(self, dataset: object) -> None:
        self._class = type(dataset).__name__
        for name in CONTRACT_MEMBERS:
            own = getattr(dataset, name, None)
            if callable(own):
                setattr(self, name, own)

    def identity(self) -> Dict[str, Any]:
        return {"class": self._class}


def told(dataset: object) -> DatasetContract:
    """`dataset` as the contract: itself where it keeps all of it, else its own members and the defaults."""
    return dataset if isinstance(dataset, DatasetContract) else _Partial(dataset)
