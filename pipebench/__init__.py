"""pipebench: benchmark PyTorch data-input pipelines and find what starves the GPU."""

__version__ = "0.1.0"
__all__ = ["__version__", "watch"]


def __getattr__(name: str):
    """`pipebench.watch`, imported on first use, so `import pipebench` stays cheap (no torch)."""
    if name == "watch":
        from pipebench.attach.watched import watch

        return watch
    raise AttributeError(f"module 'pipebench' has no attribute {name!r}")
