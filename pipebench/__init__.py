"""pipebench: benchmark PyTorch data-input pipelines and find what starves the GPU."""

__version__ = "0.1.0"
__all__ = ["__version__", "compare", "load", "run", "watch"]

# Each public name and the module it lives in, imported on first use, so `import pipebench` stays cheap
# (no torch, no Hydra).
_LAZY = {"watch": "pipebench.attach.watched", "run": "pipebench.api.calls", "load": "pipebench.api.calls",
         "compare": "pipebench.api.calls"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pipebench' has no attribute {name!r}")
