"""A typed record that still reads by key, as the stored file it was read from did."""

from typing import Any, Iterator, Mapping

__all__ = ["MappingView"]


class MappingView(Mapping[str, Any]):
    """A read-only mapping over the stored mapping `_view()` returns: typed fields for the readers that
    have moved to them, the stored keys for those that have not."""

    def _view(self) -> Mapping[str, Any]:
        raise NotImplementedError

    def __getitem__(self, name: str) -> Any:
        return self._view()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._view())

    def __len__(self) -> int:
        return len(self._view())
