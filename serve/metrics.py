"""The server's Prometheus metrics (GET /metrics), named as vLLM names its own with the
prefix `stageml:`, so that dashboards and routers that read one read the other.

Counters and histograms are updated as requests run; the gauges are read from
the engine and the adapters when scraped. `stageml:lora_requests_info` follows
the convention LoRA-aware routers read: labels `running_lora_adapters` and
`waiting_lora_adapters` (comma-separated names) and `max_lora`, its value the
time of the scrape.
"""

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96)


class Metrics:
    """One server's metrics, in a registry of its own."""

    def __init__(self, engine):
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter("stageml:request_success", "Requests that ended, by model and finish reason "
                                "(stop, length, abort, error).", ["model_name", "finished_reason"], registry=registry)
        self.rejected = Counter("stageml:request_rejected",
                                "Requests answered with an error status (4xx, 5xx), by status.", ["code"],
                                registry=registry)
        self.prompt_tokens = Counter("stageml:prompt_tokens", "Prompt tokens prefilled.", ["model_name"],
                                     registry=registry)
        self.generation_tokens = Counter("stageml:generation_tokens", "Tokens generated.", ["model_name"],
                                         registry=registry)
        self.time_to_first_token = Histogram("stageml:time_to_first_token_seconds", "Arrival to first token.",
                                             ["model_name"], buckets=LATENCY, registry=registry)
        self.inter_token_latency = Histogram("stageml:inter_token_latency_seconds", "Between a request's tokens.",
                                             ["model_name"], buckets=LATENCY, registry=registry)
        self.e2e_request_latency = Histogram("stageml:e2e_request_latency_seconds", "Arrival to the last token.",
                                             ["model_name"], buckets=LATENCY, registry=registry)
        self.step_duration = Histogram("stageml:step_duration_seconds", "One model call, by kind (prefill, decode).",
                                       ["kind"], buckets=LATENCY, registry=registry)
        self.step_rows = Histogram("stageml:step_rows", "Sequences in one model call, by kind.", ["kind"],
                                   buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=registry)
        registry.register(_EngineState(engine))

    def step(self, kind: str, rows: int, seconds: float) -> None:
        self.step_duration.labels(kind).observe(seconds)
        self.step_rows.labels(kind).observe(rows)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _EngineState:
    """The gauges, read from the engine at each scrape."""

    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        now = self.engine.snapshot()
        generator = self.engine.generator

        def gauge(name, text, value):
            family = GaugeMetricFamily(name, text)
            family.add_metric([], value)
            return family

        yield gauge("stageml:num_requests_running", "Sequences in the decode batch.", now["running"])
        yield gauge("stageml:num_requests_waiting", "Sequences waiting for a cache slot.", now["waiting"])
        yield gauge("stageml:cache_slots", "The KV cache's sequence slots.", now["slots"])
        yield gauge("stageml:cache_slots_used", "Cache slots held by running sequences.", now["running"])
        if generator.cache_bytes is not None:
            yield gauge("stageml:cache_bytes", "Bytes of the KV cache the module keeps on its device.",
                        generator.cache_bytes)
        info = GaugeMetricFamily("stageml:lora_requests_info", "Running and waiting LoRA adapters.",
                                 labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"])
        info.add_metric([",".join(now["running_adapters"]), ",".join(now["waiting_adapters"]),
                         str(now["max_adapters"])], time.time())
        yield info
        if now["max_adapters"]:
            stats = generator.stats()
            yield gauge("stageml:adapters_registered", "Adapters loaded (resident or evicted).", len(stats["adapters"]))
            yield gauge("stageml:adapter_slots", "The module's adapter slots.", stats["slots"])
            yield gauge("stageml:adapter_slots_used", "Adapter slots holding an adapter.",
                        stats["slots"] - stats["slots_free"])
            yield gauge("stageml:adapter_bytes_held", "Bytes the resident adapters hold (factors, merged weights).",
                        stats["bytes_held"])
