"""What random access into Parquet row groups costs (`dataset=parquet`, map-style), as one line.

pyarrow reads a Parquet file a row group at a time. A map-style reader keeps its last ROW_GROUPS_KEPT
row groups, so reading in order reads each once; under a shuffling sampler a sample lands in a row group
its reader does not keep about 1 - kept/groups of the time, and that row group is read whole for the one
sample (datasets#5669, #7508). `random_access_line` says so, at plan time (pipebench/cli/run.py) and in
the report's what-to-do list (pipebench/report/diagnosis.py), from the dataset's identity (`row_groups`,
`num_samples`, `file_bytes`, `streaming`) and, in the report, the bytes the job read a sample. Nothing
here imports torch, so the report can use it.
"""

from typing import Any, Mapping, Optional

__all__ = ["ROW_GROUPS_KEPT", "ROW_GROUP_ROWS", "random_access_line"]

# Row groups a map-style reader keeps decoded (a few MiB each at HF's 100 image rows): enough that
# reading in order reads each once, few enough that 8 workers x 2 stay small beside their images.
ROW_GROUPS_KEPT = 2
# The rows of a row group `convert --to parquet` writes: HF `datasets` writes image sets in row groups
# of 100 rows (its config.DEFAULT_MAX_BATCH_SIZE for image features).
ROW_GROUP_ROWS = 100
BYTES_PER_KB, BYTES_PER_MB = 1e3, 1e6


def _size(count: float) -> str:
    return f"{count / BYTES_PER_MB:.1f} MB" if count >= BYTES_PER_MB else f"{count / BYTES_PER_KB:.0f} KB"


def random_access_line(identity: Mapping[str, Any], shuffle: bool,
                       read_bytes_per_sample: Optional[float] = None) -> str:
    """One line when a map-style row-group dataset (its identity's `row_groups`) is read under a
    shuffling sampler and its row groups hold more than one row and outnumber those kept ('' otherwise):
    the share of samples that read a whole row group, what that reads (measured bytes a sample against
    a row's average size when given, else the rows and their bytes), why, and what to do."""
    groups, samples = int(identity.get("row_groups") or 0), int(identity.get("num_samples") or 0)
    if not shuffle or identity.get("streaming") or groups <= ROW_GROUPS_KEPT or samples <= groups:
        return ""
    rows = samples / groups
    row_bytes = identity["file_bytes"] / samples if identity.get("file_bytes") else None
    if read_bytes_per_sample and row_bytes:
        reads = (f"measured: {_size(read_bytes_per_sample)} read a sample against {_size(row_bytes)} a row "
                 f"({read_bytes_per_sample / row_bytes:.0f}x)")
    else:
        reads = f"{rows:.0f} rows read for one" + (f" (about {_size(rows * row_bytes)})" if row_bytes else "")
    return (f"{identity.get('name', 'dataset')}: shuffled random access reads whole row groups: {samples} samples "
            f"in {groups} row groups of {rows:.0f} rows on average, and a reader keeps its last {ROW_GROUPS_KEPT}, "
            f"so about {100 * (1 - ROW_GROUPS_KEPT / groups):.0f}% of samples (loader.shuffle=true) land in one not "
            f"kept and read it whole, {reads}; dataset.streaming=true reads each row group once, split across "
            "workers, or write row groups of fewer rows (`pipebench dataset convert --to parquet --shard-size N`: "
            f"N rows a file, one row group below {ROW_GROUP_ROWS}), or use loader.shuffle=false where order does "
            "not matter")
