"""The stages a timed step runs in, by the names result files record (`stage` of each transform
row). Apart from the timed chain so that readers of results (the report, the diagnosis) know them
without importing torch."""

LOAD_STAGE = "load"
# PIL.Image.open only reads the header; the pixels are decoded at the first pixel access. The
# chain forces that decode right after the load, timed as its own step, so it is charged to
# decode and not to whichever transform happens to touch the pixels first.
DECODE_STAGE = "decode"
PER_SAMPLE_STAGE = "per_sample"
COLLATE_STAGE = "collate"
PER_BATCH_STAGE = "per_batch"
