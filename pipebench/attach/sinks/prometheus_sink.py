"""`--prometheus-port P`: an HTTP endpoint scraped while the run goes on, with prometheus_client.

Per loader and rank: gauges of the last window's samples/s, starvation, the recorder's own share
and wait quantiles, and a histogram of the windows' p50 waits (a histogram of every wait would cost
the loop a lock a step; the windows' quantiles are what the series holds). Rank K serves on port
P + K under torchrun.
"""

from pipebench.attach.sinks.common import METRIC_PREFIX, SINK_METRICS, WindowPoint, metric_values, need
from pipebench.base.errors import ConfigError

__all__ = ["PrometheusSink", "start"]

# Prometheus names allow no slash: pipebench/ becomes pipebench_.
NAME_PREFIX = METRIC_PREFIX.rstrip("/") + "_"
LABELS = ("loader", "rank")
# The histogram's figure: the window's median wait.
HISTOGRAM_METRIC = "wait_p50_ms"
# Buckets of the windows' median wait, in ms: from a loader that keeps up (< 1 ms) to a stalled one.
WAIT_BUCKETS_MS = (0.1, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000, float("inf"))


class PrometheusSink:
    name = "Prometheus"

    def __init__(self, port: int) -> None:
        from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

        self.registry = CollectorRegistry()
        self.gauges = {key: Gauge(NAME_PREFIX + key, f"pipebench's last window: {key}", LABELS,
                                  registry=self.registry) for key in SINK_METRICS}
        self.waits = Histogram(NAME_PREFIX + "window_wait_p50_ms", "the windows' median data wait, ms", LABELS,
                               buckets=WAIT_BUCKETS_MS, registry=self.registry)
        self.server, _ = start_http_server(port, registry=self.registry)

    def window(self, point: WindowPoint) -> None:
        labels = {"loader": point.site, "rank": str(point.rank)}
        for key, value in metric_values(point).items():
            self.gauges[key].labels(**labels).set(value)
            if key == HISTOGRAM_METRIC:
                self.waits.labels(**labels).observe(value)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start(port: int, rank: int) -> PrometheusSink:
    need("prometheus_client", "--prometheus-port", "prometheus-client")
    try:
        return PrometheusSink(port + rank)
    except OSError as exc:
        raise ConfigError(f"--prometheus-port {port + rank}: cannot serve there ({exc.strerror or exc})") from None
