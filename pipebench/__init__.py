"""pipebench: benchmark PyTorch data-input pipelines and find what starves the GPU."""

__version__ = "0.1.0"
