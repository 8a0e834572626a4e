"""`--tensorboard DIR`: each window's figures as TensorBoard scalars, with torch's own `SummaryWriter`
(which needs the `tensorboard` package), the step of each point the window's last step."""

import os
from pathlib import Path
from pipebench.attach.sinks.common import WindowPoint, metric_tags, need
from pipebench.base.errors import ConfigError

__all__ = ["TensorBoardSink", "start"]


class TensorBoardSink:
    name = "TensorBoard"

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder))
        self.loaders: set = set()

    def window(self, point: WindowPoint) -> None:
        for tag, value in metric_tags(point, self.loaders).items():
            self.writer.add_scalar(tag, value, global_step=int(point.last_step))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def start(folder: str, rank: int) -> TensorBoardSink:
    """The writer in `folder` (a rank's own subfolder `rank-K` under torchrun, rank 0 in `folder` itself)."""
    need("tensorboard", "--tensorboard", "tensorboard")
    path = Path(folder) / (f"rank-{rank}" if rank else "")
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK):
            raise PermissionError(f"{path} is not writable")
    except OSError as exc:
        raise ConfigError(f"--tensorboard {folder}: cannot write there ({exc})") from None
    return TensorBoardSink(path)
