"""vLLM's Prometheus metrics (names, types, buckets, labels as vLLM 0.33 exports them), rendered
in the Prometheus text format 0.0.4 the way prometheus_client does (counters get ``_total``).

Lab-only series (never vLLM's) are named ``pdctl_lab_...``: ``pdctl_lab_engine_info`` (the release,
with the vLLM version it impersonates as label ``version``) and, on a KV consumer,
``pdctl_lab_cross_release_pairs_total`` (KV pulls refused because the producer runs another release)."""
from __future__ import annotations

import math
import os
import resource
import time

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
NIXL_XFER_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))


def _fmt(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if float(value).is_integer():
        return f"{float(value):.1f}"
    return repr(float(value))


def _labels(names, values) -> str:
    inner = ",".join(f'{n}="{v}"' for n, v in zip(names, values))
    return "{" + inner + "}" if inner else ""


class Metric:
    def __init__(self, name, kind, doc, labelnames=("model_name", "engine")):
        self.name, self.kind, self.doc, self.labelnames = name, kind, doc, tuple(labelnames)
        self.series: dict[tuple, object] = {}

    def labels(self, *values):
        values = tuple(str(v) for v in values)
        if values not in self.series:
            self.series[values] = self._new()
        return values

    def _new(self):
        return 0.0


class Counter(Metric):
    def __init__(self, name, doc, labelnames=("model_name", "engine")):
        super().__init__(name, "counter", doc, labelnames)

    def inc(self, values, amount=1.0):
        self.labels(*values)
        self.series[tuple(str(v) for v in values)] += amount

    def render(self):
        name = self.name + "_total"
        lines = [f"# HELP {name} {self.doc}", f"# TYPE {name} counter"]
        for values, v in self.series.items():
            lines.append(f"{name}{_labels(self.labelnames, values)} {_fmt(v)}")
        return lines


class Gauge(Metric):
    def __init__(self, name, doc, labelnames=("model_name", "engine")):
        super().__init__(name, "gauge", doc, labelnames)

    def set(self, values, value):
        self.labels(*values)
        self.series[tuple(str(v) for v in values)] = float(value)

    def render(self):
        lines = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} gauge"]
        for values, v in self.series.items():
            lines.append(f"{self.name}{_labels(self.labelnames, values)} {_fmt(v)}")
        return lines


class Histogram(Metric):
    def __init__(self, name, doc, buckets, labelnames=("model_name", "engine")):
        self.buckets = tuple(buckets) + (math.inf,)
        super().__init__(name, "histogram", doc, labelnames)

    def _new(self):
        return {"counts": [0] * len(self.buckets), "sum": 0.0}

    def observe(self, values, value):
        key = self.labels(*values)
        s = self.series[key]
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                s["counts"][i] += 1
                break
        s["sum"] += value

    def count_sum(self, values):
        s = self.series.get(tuple(str(v) for v in values))
        return (sum(s["counts"]), s["sum"]) if s else (0, 0.0)

    def render(self):
        lines = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} histogram"]
        for values, s in self.series.items():
            cumulative = 0
            for bound, n in zip(self.buckets, s["counts"]):
                cumulative += n
                le = self.labelnames + ("le",)
                lines.append(f"{self.name}_bucket{_labels(le, values + (_fmt(bound),))} {_fmt(cumulative)}")
            lines.append(f"{self.name}_count{_labels(self.labelnames, values)} {_fmt(cumulative)}")
            lines.append(f"{self.name}_sum{_labels(self.labelnames, values)} {_fmt(s['sum'])}")
        return lines


class EngineMetrics:
    """All series for one served model and its DP ranks (label ``engine`` = DP rank)."""

    FINISH_REASONS = ("stop", "length", "abort", "error")

    def __init__(self, model_name: str, dp_size: int, spec_decode: bool, kv_connector: bool,
                 release: dict | None = None, api_servers: int | None = None):
        """api_servers: vLLM's --api-server-count (None: its default, the DP size). More than one API server puts
        vLLM 0.33's /metrics on prometheus_client's multiprocess registry, which has no process_* series
        (shared/facts.md, "Metrics with DP > 1"): the stand-in then has none either."""
        self.model_name = model_name
        self.multiprocess = (api_servers if api_servers is not None else dp_size) > 1
        release = release or {}
        self.info = Gauge("pdctl_lab_engine_info", "Lab stand-in release; label version is the vLLM version it "
                          "impersonates (what /version answers).", ("model_name", "version", "release", "standin_version"))
        self.info.set((model_name, release.get("vllm_version", ""), release.get("name", ""),
                       release.get("version", "")), 1)
        self.engines = [str(i) for i in range(dp_size)]
        self.start_time = time.time()
        self.all = []
        add = self.all.append
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        for m in (self.running, self.waiting, self.kv_usage):
            add(m)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.request_success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                       ("model_name", "engine", "finished_reason"))
        for m in (self.preemptions, self.prompt_tokens, self.generation_tokens, self.request_success):
            add(m)
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = Histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS)
        self.queue = Histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prefill_time = Histogram("vllm:request_prefill_time_seconds",
                                      "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.decode_time = Histogram("vllm:request_decode_time_seconds",
                                     "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        for m in (self.ttft, self.itl, self.tpot, self.e2e, self.queue, self.prefill_time, self.decode_time):
            add(m)
        self.spec_decode = spec_decode
        if spec_decode:
            self.spec_drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
            self.spec_draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
            self.spec_accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
            for m in (self.spec_drafts, self.spec_draft_tokens, self.spec_accepted):
                add(m)
        self.kv_connector = kv_connector
        if kv_connector:
            self.nixl_xfer_time = Histogram("vllm:nixl_xfer_time_seconds",
                                            "Histogram of transfer duration for NIXL KV Cache transfers.",
                                            NIXL_XFER_TIME_BUCKETS)
            self.nixl_bytes = Histogram("vllm:nixl_bytes_transferred",
                                        "Histogram of bytes transferred per NIXL KV Cache transfers.",
                                        NIXL_BYTES_BUCKETS)
            self.nixl_failed = Counter("vllm:nixl_num_failed_transfers",
                                       "Number of failed NIXL KV Cache transfers, including handshake and "
                                       "notification failures. NOTE: KV expiry is tracked separately in "
                                       "vllm:nixl_num_kv_expired_reqs.")
            self.nixl_expired = Counter("vllm:nixl_num_kv_expired_reqs",
                                        "Number of requests that had their KV expire. NOTE: This metric is "
                                        "tracked on the P instance.")
            for m in (self.nixl_xfer_time, self.nixl_bytes, self.nixl_failed, self.nixl_expired):
                add(m)
            # Lab only: pulls refused by a producer of another release (also in nixl_failed).
            self.cross_release = Counter("pdctl_lab_cross_release_pairs",
                                         "Lab stand-in: KV pulls refused because prefill and decode run "
                                         "different releases (NIXL compatibility hash mismatch).")
            add(self.cross_release)
        # vLLM creates every per-engine series up front, so they exist (at 0) before traffic.
        for e in self.engines:
            key = (model_name, e)
            for m in self.all:
                if m is self.request_success:
                    for reason in self.FINISH_REASONS:
                        m.labels(model_name, e, reason)
                else:
                    m.labels(*key)

    def key(self, rank: int) -> tuple[str, str]:
        return (self.model_name, str(rank))

    def render(self) -> str:
        lines: list[str] = []
        if not self.multiprocess:
            lines += _process_metrics(self.start_time)
        # Lab only (the benchmarks tell one engine process from the next by it, whatever vLLM's registry).
        lines += ["# HELP pdctl_lab_engine_start_time_seconds When this stand-in process started (Unix epoch).",
                  "# TYPE pdctl_lab_engine_start_time_seconds gauge",
                  f"pdctl_lab_engine_start_time_seconds {_fmt(round(self.start_time, 2))}"]
        lines += self.info.render()
        for m in self.all:
            lines += m.render()
        return "\n".join(lines) + "\n"


def _process_metrics(start_time: float) -> list[str]:
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/statm") as fh:
        vm_pages, rss_pages = (int(x) for x in fh.read().split()[:2])
    ru = resource.getrusage(resource.RUSAGE_SELF)
    fds = len(os.listdir("/proc/self/fd"))
    max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return [
        "# HELP process_virtual_memory_bytes Virtual memory size in bytes.",
        "# TYPE process_virtual_memory_bytes gauge",
        f"process_virtual_memory_bytes {_fmt(vm_pages * page)}",
        "# HELP process_resident_memory_bytes Resident memory size in bytes.",
        "# TYPE process_resident_memory_bytes gauge",
        f"process_resident_memory_bytes {_fmt(rss_pages * page)}",
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {_fmt(round(start_time, 2))}",
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.",
        "# TYPE process_cpu_seconds_total counter",
        f"process_cpu_seconds_total {_fmt(round(ru.ru_utime + ru.ru_stime, 2))}",
        "# HELP process_open_fds Number of open file descriptors.",
        "# TYPE process_open_fds gauge",
        f"process_open_fds {_fmt(fds)}",
        "# HELP process_max_fds Maximum number of open file descriptors.",
        "# TYPE process_max_fds gauge",
        f"process_max_fds {_fmt(max_fds)}",
    ]
