"""Server metrics in the Prometheus text exposition format (no client library needed)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
FIRST_STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class Histogram:
    def __init__(self, buckets: Sequence[float]):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, b in enumerate(self.buckets):
            if value <= b:
                self.counts[i] += 1

    def render(self, name: str, help_: str) -> list[str]:
        out = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        out += [f'{name}_bucket{{le="{b:g}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
        return out


class Metrics:
    """Counters, gauges and histograms of one server process (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter = Counter()  # (endpoint, status) -> n
        self.latency = Histogram(LATENCY_BUCKETS)
        self.batch_sizes = Histogram(BATCH_BUCKETS)
        """Rows per engine tick (and jobs per fixed-batch call)."""
        self.first_step = Histogram(FIRST_STEP_BUCKETS)
        self.ticks = 0
        self.generated_tokens = 0
        self.forward_passes = 0
        self.batches_failed = 0
        self.sampler_seconds = 0.0
        self.last_tokens_per_s = 0.0
        self.cancelled = 0

    def request_done(self, endpoint: str, status: int, seconds: float | None = None) -> None:
        with self._lock:
            self.requests[(endpoint, int(status))] += 1
            if seconds is not None and status == 200:
                self.latency.observe(seconds)

    def tick_done(self, rows: int, seconds: float, forward_passes: int, *, failed: bool) -> None:
        """One engine tick over `rows` rows (a failed one counts as a failed batch)."""
        with self._lock:
            self.ticks += 1
            self.sampler_seconds += seconds
            self.forward_passes += forward_passes
            if failed:
                self.batches_failed += 1
            else:
                self.batch_sizes.observe(rows)

    def first_step_after(self, seconds: float) -> None:
        """A job's first tick ended `seconds` after its request was queued."""
        with self._lock:
            self.first_step.observe(seconds)

    def row_done(self, tokens: int, seconds: float) -> None:
        """A row finished with `tokens` response tokens, `seconds` after its first tick."""
        with self._lock:
            self.generated_tokens += tokens
            self.last_tokens_per_s = tokens / seconds if seconds > 0 else 0.0

    def batch_done(self, size: int, seconds: float, tokens: int, forward_passes: int, failed: bool) -> None:
        """One fixed-batch sampler call of `size` jobs."""
        with self._lock:
            self.batch_sizes.observe(size)
            self.sampler_seconds += seconds
            if failed:
                self.batches_failed += 1
                return
            self.generated_tokens += tokens
            self.forward_passes += forward_passes
            self.last_tokens_per_s = tokens / seconds if seconds > 0 else 0.0

    def render(self, *, queue_length: int, running: int, batch_tokens: int = 0) -> str:
        p = "dsl_llada_"
        with self._lock:
            lines = [f"# HELP {p}requests_total Finished HTTP requests by endpoint and status code.",
                     f"# TYPE {p}requests_total counter"]
            lines += [f'{p}requests_total{{endpoint="{e}",status="{s}"}} {n}' for (e, s), n in sorted(self.requests.items())]
            lines += [f"# HELP {p}queue_length Generation jobs waiting for a row.", f"# TYPE {p}queue_length gauge",
                      f"{p}queue_length {queue_length}",
                      f"# HELP {p}jobs_running Rows (generation jobs) in the running batch.",
                      f"# TYPE {p}jobs_running gauge", f"{p}jobs_running {running}",
                      f"# HELP {p}batch_tokens Prompt + response tokens of the engine's running rows.",
                      f"# TYPE {p}batch_tokens gauge", f"{p}batch_tokens {batch_tokens}"]
            lines += self.latency.render(f"{p}request_latency_seconds", "Latency of successful generation requests.")
            lines += self.batch_sizes.render(f"{p}batch_size", "Rows per engine tick (jobs per fixed-batch call).")
            lines += self.first_step.render(f"{p}time_to_first_step_seconds",
                                            "Seconds from a job's arrival to the end of its first denoising tick.")
            for name, kind, value, help_ in (
                ("engine_ticks_total", "counter", self.ticks, "Engine ticks (one batched forward over the running rows)."),
                ("generated_tokens_total", "counter", self.generated_tokens, "Response tokens generated (after EOS truncation)."),
                ("forward_passes_total", "counter", self.forward_passes, "Backbone forward passes run by the samplers."),
                ("sampler_seconds_total", "counter", round(self.sampler_seconds, 6), "Seconds spent in ticks and sampler calls."),
                ("batches_failed_total", "counter", self.batches_failed, "Ticks and sampler calls that raised an exception."),
                ("jobs_cancelled_total", "counter", self.cancelled, "Jobs whose client disconnected before the end."),
                ("generated_tokens_per_second", "gauge", round(self.last_tokens_per_s, 3),
                 "Generated tokens per second of the last finished row (over its time in the batch)."),
            ):
                lines += [f"# HELP {p}{name} {help_}", f"# TYPE {p}{name} {kind}", f"{p}{name} {value}"]
            overall = self.generated_tokens / self.sampler_seconds if self.sampler_seconds else 0.0
            lines += [f"# HELP {p}generated_tokens_per_second_overall Generated tokens per sampler-busy second.",
                      f"# TYPE {p}generated_tokens_per_second_overall gauge",
                      f"{p}generated_tokens_per_second_overall {overall:.3f}"]
        return "\n".join(lines) + "\n"
