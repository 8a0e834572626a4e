"""The largest value each numeric setting may take, and why.

A value past these is a typo or a unit slip, not a benchmark: it would hang a sweep for hours,
fill the memory or the disk, or overflow a C call (a queue timeout of 1e12 s raises
OverflowError deep inside torch). Specs and the catalogue datasets reject it up front, in one
line naming the key. Every float must also be finite: `inf` and `nan` parse as floats.
"""

# A minute per emulated accelerator step: real training steps take milliseconds to seconds.
MAX_STEP_MS = 60_000.0
# A day for any timeout or minimum measuring time: past that it is no timeout, and the C calls
# it reaches (queue waits, the process group's timedelta) overflow somewhere above 1e9 s.
MAX_TIMEOUT_S = 86_400.0
# A week for `pipebench tune --budget-s`: a search is minutes to hours; past that the value is a
# unit slip (minutes typed as seconds) or 1e300, and the host drifts under any race that long.
MAX_TUNE_BUDGET_S = 7 * 86_400.0
# A million steps is hours for the fastest pipeline; each measured step keeps a few numbers.
MAX_STEPS = 1_000_000
# Profiled steps each add megabytes to the torch.profiler or viztracer trace.
MAX_PROFILE_STEPS = 1_000
# Repeats and rounds multiply the whole measurement.
MAX_REPEATS = 1_000
# More DataLoader workers than any host has cores; each is a process with a copy of the dataset.
MAX_WORKERS = 256
# torchrun ranks on one node: more than any node has GPUs or cores.
MAX_RANKS = 256
# The largest batches trained in practice (LARS, LAMB) are tens of thousands of samples.
MAX_BATCH_SIZE = 65_536
# Each prefetched batch waits in shared memory: workers x prefetch x batch bytes must fit /dev/shm.
MAX_PREFETCH_FACTOR = 64
# numpy's legacy seeding (np.random.seed) takes 32 bits.
MAX_SEED = 2**32 - 1
# Samples in a generated dataset: ImageNet-1k has 1.28 million; each sample keeps an 8-byte label.
MAX_DATASET_LENGTH = 100_000_000
# Elements of one generated sample (random_tensors shape): 256 MiB of uint8 per sample.
MAX_SAMPLE_ELEMENTS = 2**28
# Distinct samples a generated dataset builds up front (random_tensors' pool, synthetic_jpeg's files).
MAX_DISTINCT_SAMPLES = 65_536
# Bytes of random_tensors' pool, built in every process that reads it.
MAX_POOL_BYTES = 2**32
# Pixels a side of a generated JPEG: 8192 x 8192 stays below PIL's decompression-bomb limit.
MAX_IMAGE_SIDE = 8_192
# Emulated storage latency a file read (dataset.storage.latency_ms): network storage answers in
# milliseconds, a cold object store in about a second; ten seconds a read is a hang, not storage.
MAX_STORAGE_LATENCY_MS = 10_000.0
# Emulated storage bandwidth (dataset.storage.mb_per_s), MiB/s: from a slow network share (0.1) to
# past any local NVMe array (1e6, about a TB/s). Below the floor one JPEG takes minutes to read.
# The same range bounds the host-wide bandwidth every worker and rank shares (shared_mb_per_s).
MIN_STORAGE_MB_PER_S = 0.1
MAX_STORAGE_MB_PER_S = 1_000_000.0
