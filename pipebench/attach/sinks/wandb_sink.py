"""`--wandb PROJECT`: each window's figures logged to W&B, in the script's run where it has one
(`wandb.run`), else in a run of pipebench's own, offline unless WANDB_MODE says otherwise."""

import os
from pipebench.attach.sinks.common import WindowPoint, metric_tags, need
from pipebench.base.errors import ConfigError

__all__ = ["WandbSink", "start"]


class WandbSink:
    name = "W&B"

    def __init__(self, project: str) -> None:
        import wandb

        self.wandb = wandb
        self.project = project
        self.own = None
        self.loaders: set = set()

    def _run(self):
        if self.wandb.run is not None:
            return self.wandb.run
        if self.own is None:
            self.own = self.wandb.init(project=self.project, mode=os.getenv("WANDB_MODE", "offline"),
                                       job_type="pipebench")
        return self.own

    def window(self, point: WindowPoint) -> None:
        values = metric_tags(point, self.loaders)
        run = self._run()
        # In the script's own run, commit=False: the point joins the script's current step rather than
        # advancing W&B's step counter under the user's loss curve.
        run.log({**values, "pipebench/step": int(point.last_step)}, commit=run is self.own)

    def close(self) -> None:
        if self.own is not None:
            self.own.finish()


def start(project: str, rank: int) -> WandbSink:
    need("wandb", "--wandb", "wandb")
    try:
        return WandbSink(project)
    except Exception as exc:
        raise ConfigError(f"--wandb {project}: cannot start ({type(exc).__name__}: {exc})") from None
