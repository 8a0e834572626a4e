"""`--mlflow URI`: each window's figures as MLflow metrics, in the script's active run where it has
one (`mlflow.active_run()`), else in a run of pipebench's own in that tracking store."""

from pipebench.attach.sinks.common import WindowPoint, metric_tags, need
from pipebench.base.errors import ConfigError

__all__ = ["MlflowSink", "start"]


class MlflowSink:
    name = "MLflow"

    def __init__(self, uri: str) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.own = None
        self.loaders: set = set()
        active = mlflow.active_run()
        self.fixed_run = active.info.run_id if active is not None else None

    def _run_id(self) -> str:
        import mlflow

        active = mlflow.active_run()
        if active is not None:
            return active.info.run_id
        if self.fixed_run is not None:
            return self.fixed_run
        if self.own is None:
            experiment = self.client.get_experiment_by_name("pipebench")
            experiment_id = (experiment.experiment_id if experiment is not None
                             else self.client.create_experiment("pipebench"))
            self.own = self.client.create_run(experiment_id, run_name="pipebench attach").info.run_id
        return self.own

    def window(self, point: WindowPoint) -> None:
        run_id = self._run_id()
        for tag, value in metric_tags(point, self.loaders).items():
            self.client.log_metric(run_id, tag, value, step=int(point.last_step))

    def close(self) -> None:
        if self.own is not None:
            self.client.set_terminated(self.own)


def start(uri: str, rank: int) -> MlflowSink:
    need("mlflow", "--mlflow", "mlflow-skinny")
    try:
        return MlflowSink(uri)
    except Exception as exc:  # mlflow raises its own types for a store it cannot open
        raise ConfigError(f"--mlflow {uri}: cannot open the tracking store ({type(exc).__name__}: {exc})") from None
