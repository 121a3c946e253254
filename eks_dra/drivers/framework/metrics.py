"""Prometheus metrics of one driver (own registry, so several drivers can share a test process).

    eks_dra_prepare_total{driver,result}            claims prepared (result ok|error)
    eks_dra_unprepare_total{driver,result}          claims unprepared
    eks_dra_prepare_seconds{driver}                 histogram of per-claim prepare latency
    eks_dra_unprepare_seconds{driver}               histogram of per-claim unprepare latency
    eks_dra_prepared_claims{driver}                 claims currently in the checkpoint
    eks_dra_published_devices{driver}               devices in the published slices
    eks_dra_unhealthy_devices{driver}               devices withdrawn for health
    eks_dra_health_changes_total{driver,health}     device health transitions (health healthy|unhealthy)
    eks_dra_slice_writes_total{driver,op}           ResourceSlice writes (op create|update|delete)
    eks_dra_api_errors_total{driver,call}           failed API calls
    eks_dra_reconcile_runs_total{driver}            reconciler passes
    eks_dra_orphans_cleaned_total{driver,kind}      orphans removed (kind claim|cdi_spec)
    eks_dra_checkpoint_corrupt_total{driver}        corrupt checkpoints moved aside
    eks_dra_cdi_specs_rewritten_total{driver}       CDI specs rewritten (reboot, wiped /var/run/cdi)
    eks_dra_gpu_tool_unavailable_total{driver,tool} NVIDIA tools found unusable (tool nvml|nvidia-smi), once per outage
"""

from __future__ import annotations

import gzip

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from .http_server import BoundedHttpServer, Request, Response

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class DriverMetrics:
    def __init__(self, driver: str) -> None:
        self.registry = CollectorRegistry()
        r, d = self.registry, ("driver",)
        self.prepare = Counter("eks_dra_prepare", "Claims prepared", d + ("result",), registry=r)
        self.unprepare = Counter("eks_dra_unprepare", "Claims unprepared", d + ("result",), registry=r)
        self.prepare_seconds = Histogram("eks_dra_prepare_seconds", "Per-claim prepare latency", d,
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.unprepare_seconds = Histogram("eks_dra_unprepare_seconds", "Per-claim unprepare latency", d,
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.prepared_claims = Gauge("eks_dra_prepared_claims", "Claims in the checkpoint", d, registry=r)
        self.published_devices = Gauge("eks_dra_published_devices", "Devices in published slices", d, registry=r)
        self.unhealthy_devices = Gauge("eks_dra_unhealthy_devices", "Devices withdrawn for health", d, registry=r)
        self.health_changes = Counter("eks_dra_health_changes", "Device health transitions", d + ("health",),
                                      registry=r)
        self.slice_writes = Counter("eks_dra_slice_writes", "ResourceSlice writes", d + ("op",), registry=r)
        self.api_errors = Counter("eks_dra_api_errors", "Failed API calls", d + ("call",), registry=r)
        self.reconcile_runs = Counter("eks_dra_reconcile_runs", "Reconciler passes", d, registry=r)
        self.orphans_cleaned = Counter("eks_dra_orphans_cleaned", "Orphans removed", d + ("kind",), registry=r)
        self.checkpoint_corrupt = Counter("eks_dra_checkpoint_corrupt", "Corrupt checkpoints moved aside", d,
                                          registry=r)
        self.cdi_rewritten = Counter("eks_dra_cdi_specs_rewritten", "CDI specs rewritten", d, registry=r)
        self.gpu_tool_unavailable = Counter("eks_dra_gpu_tool_unavailable", "NVIDIA tools found unusable",
                                            d + ("tool",), registry=r)
        self.driver = driver

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (tests and the bench read metrics through this)."""
        v = self.registry.get_sample_value(name, {"driver": self.driver, **labels})
        return v or 0.0

    def serve(self, port: int, address: str = "0.0.0.0") -> BoundedHttpServer:
        """Expose /metrics over HTTP; returns the started server (stop it on exit). Not prometheus_client's
        server: that one spends a thread per connection, with no cap and no read timeout."""
        return BoundedHttpServer("metrics", address, port, {"/metrics": self._scrape}).start()

    def _scrape(self, request: Request) -> Response:
        # The scraper's Accept picks the text or OpenMetrics format, as prometheus_client's own handler does.
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        body = encoder(self.registry)
        if "gzip" in request.headers.get("accept-encoding", ""):
            return Response(200, gzip.compress(body), content_type, {"Content-Encoding": "gzip"})
        return Response(200, body, content_type)
