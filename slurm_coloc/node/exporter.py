"""The sampler's Prometheus endpoint: ``/metrics`` on ``exporter_bind_address:exporter_port`` (the only
importer of prometheus_client).

A custom collector turns the live state (node/livestate.py) into metric families at each scrape, so series
exist exactly while their GPU is read and their job runs. Three name sets (``exporter_names``; docs/metrics.md
lists every metric): ``coloc`` (Prometheus conventions), ``jobstats`` (the ``nvidia_gpu_*`` names and labels
PrincetonUniversity/jobstats queries, plus ``jobid`` so jobs on one GPU stay apart) and ``dcgm``
(dcgm-exporter's ``DCGM_FI_*`` with ``hpc_job``). In the two compatible sets a job's series carry its own
memory and its share of the GPU's rates (the GPU's figure x the job's share, the Epilog's attribution rule).

The endpoint never stops the sampler: a port in use is one error line (bind retried every ``BIND_RETRY_S``),
a collector failure one error line per kind, and the server holds at most ``metrics_server.MAX_CONNECTIONS``
connections, each for at most ``metrics_server.CONNECTION_DEADLINE_S``.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from slurm_coloc.config import Config
from slurm_coloc.node import metrics_server
from slurm_coloc.node.livestate import MIB, JobGpuView, LiveState, View, ctld_oom_counts, node_job_rows
from slurm_coloc.nvml.readings import GpuReading

log = logging.getLogger("slurm_coloc.sampler")

BIND_RETRY_S = 30.0

# coloc names: (metric suffix, GpuReading attribute, scale to base units, help)
_GPU_GAUGES = (
    ("utilization_ratio", "util_pct", 0.01,
     "Coarse NVML GPU utilization (share of time a kernel ran), 0..1."),
    ("memory_utilization_ratio", "mem_util_pct", 0.01, "NVML memory-controller utilization, 0..1."),
    ("sm_active_ratio", "smact_pct", 0.01,
     "GPM SM activity over the last sampling interval, 0..1 (Hopper+)."),
    ("sm_occupancy_ratio", "smocc_pct", 0.01,
     "GPM SM occupancy over the last sampling interval, 0..1 (Hopper+)."),
    ("tensor_active_ratio", "tensor_pct", 0.01, "GPM any-tensor-pipe activity, 0..1 (Hopper+)."),
    ("dram_active_ratio", "dram_bw_pct", 0.01, "GPM DRAM bandwidth utilization, 0..1 (Hopper+)."),
    ("memory_used_bytes", "mem_used_mib", MIB, "Device memory in use (bytes)."),
    ("memory_total_bytes", "mem_total_mib", MIB, "Device memory (bytes)."),
    ("power_watts", "power_w", 1.0, "Board power draw (W)."),
    ("temperature_celsius", "temp_c", 1.0, "GPU temperature (Celsius)."),
    ("sm_clock_hertz", "sm_clock_mhz", 1e6, "SM clock (Hz)."),
)
# dcgm-exporter names: (name, attribute, scale, split by the job's share, help)
_DCGM = (
    ("DCGM_FI_DEV_GPU_UTIL", "util_pct", 1.0, True, "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_util_pct", 1.0, True, "Memory utilization (in %)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", 1.0, True, "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_TEMP", "temp_c", 1.0, False, "GPU temperature (in C)."),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", 1.0, False, "SM clock frequency (in MHz)."),
    ("DCGM_FI_PROF_SM_ACTIVE", "smact_pct", 0.01, True,
     "The ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "smocc_pct", 0.01, True, "The ratio of resident warps on an SM."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_pct", 0.01, True, "Ratio of cycles a tensor pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "dram_bw_pct", 0.01, True, "Ratio of cycles the device memory is active."),
)


def _v(g: GpuReading, attr: str, scale: float) -> Optional[float]:
    x = getattr(g, attr)
    return None if x is None else float(x) * scale


class ColocCollector:
    """prometheus_client collector over a ``LiveState``; ``oom_counts``: ``(deaths, reruns)`` or None."""

    def __init__(self, state: LiveState, names: str = "coloc",
                 oom_counts: Optional[Callable[[], Optional[Tuple[int, int]]]] = None) -> None:
        self.state, self.names, self.oom_counts = state, names, oom_counts
        self.collect_errors = 0
        self._logged: set = set()

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: families depend on the live state (registered with ``auto_describe`` off)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The families of one scrape; a failure is logged once per kind and leaves the health families."""
        try:
            view = self.state.view()
            fams = {"coloc": self._coloc, "jobstats": self._jobstats, "dcgm": self._dcgm}[self.names](view)
        except Exception as exc:  # a scrape must answer; the sampler goes on
            self.collect_errors += 1
            kind = f"{type(exc).__name__}: {exc}"
            if kind not in self._logged:
                self._logged.add(kind)
                log.error("metrics: cannot build the scrape from the sampler's state (%s); serving health "
                          "metrics only; sampling goes on", kind)
            view, fams = None, []
        yield from fams
        yield from self._health(view)

    def _health(self, view: Optional[View]) -> List[Metric]:
        out: List[Metric] = []
        node = self.state.node
        c = CounterMetricFamily("coloc_exporter_collect_errors", "Scrapes that failed to read the sampler's "
                                "state.", labels=["node"])
        c.add_metric([node], self.collect_errors)
        out.append(c)
        if view is None:
            return out
        f = CounterMetricFamily("coloc_sampler_frames", "NVML frames the sampler read.", labels=["node"])
        f.add_metric([node], view.frames)
        e = CounterMetricFamily("coloc_sampler_read_errors", "NVML reads that failed.", labels=["node"])
        e.add_metric([node], view.read_errors)
        ok = GaugeMetricFamily("coloc_exporter_job_rows_ok", "1 when the node database's running jobs "
                               "could be read at the last try, else 0 (job series then lack user and grant).",
                               labels=["node"])
        ok.add_metric([node], 1.0 if view.job_rows_ok else 0.0)
        st = GaugeMetricFamily("coloc_sampler_start_time_seconds", "When the sampler started (Unix time).",
                               labels=["node"])
        st.add_metric([node], view.started_ts)
        out += [f, e, ok, st]
        if view.frame_ts is not None:
            ts = GaugeMetricFamily("coloc_sampler_last_frame_timestamp_seconds",
                                   "Wall time of the latest NVML frame (Unix time).", labels=["node"])
            ts.add_metric([node], view.frame_ts)
            out.append(ts)
        counts = self.oom_counts() if self.oom_counts else None
        if counts is not None:
            d = CounterMetricFamily("coloc_oom_deaths", "Jobs that died of GPU out-of-memory (whole cluster, "
                                    "from the controller database).")
            d.add_metric([], counts[0])
            r = CounterMetricFamily("coloc_oom_reruns", "OOM deaths rerun on a whole GPU (whole cluster).")
            r.add_metric([], counts[1])
            out += [d, r]
        return out

    def _coloc(self, view: View) -> List[Metric]:
        glabels = ["node", "gpu", "uuid", "name"]
        fams: List[Metric] = []
        for suffix, attr, scale, text in _GPU_GAUGES:
            m = GaugeMetricFamily(f"coloc_gpu_{suffix}", text, labels=glabels)
            for g in view.gpus:
                x = _v(g.reading, attr, scale)
                if x is not None:
                    m.add_metric(self._gl(view, g.reading), x)
            fams.append(m)
        energy = CounterMetricFamily("coloc_gpu_energy_joules", "NVML total energy counter since the driver "
                                     "loaded (J).", labels=glabels)
        mps = GaugeMetricFamily("coloc_gpu_mps_enabled", "1 when a CUDA MPS daemon serves the GPU's jobs.",
                                labels=glabels)
        ten = GaugeMetricFamily("coloc_gpu_tenants", "Jobs running on the GPU.", labels=glabels)
        for g in view.gpus:
            lab = self._gl(view, g.reading)
            if g.reading.energy_j is not None:
                energy.add_metric(lab, float(g.reading.energy_j))
            mps.add_metric(lab, 1.0 if g.mps else 0.0)
            ten.add_metric(lab, float(g.tenants))
        fams += [energy, mps, ten]
        jl = ["node", "gpu", "jobid", "user", "mode"]
        used = GaugeMetricFamily("coloc_job_gpu_memory_used_bytes", "NVML memory of the job's processes on "
                                 "the GPU (bytes, CUDA contexts included).", labels=jl)
        granted = GaugeMetricFamily("coloc_job_gpu_memory_granted_bytes", "GPU memory the job was granted "
                                    "on the GPU: shards x 1 GiB (the estimate rounded up), or the whole GPU.",
                                    labels=jl)
        sm = GaugeMetricFamily("coloc_job_gpu_sm_utilization_ratio", "NVML SM utilization of the job's "
                               "processes, 0..1 (absent under MPS: NVML gives none per client).", labels=jl)
        share = GaugeMetricFamily("coloc_job_gpu_share_ratio", "The job's share of the GPU at the latest "
                                  "frame (SM utilization, else memory; the energy attribution rule), 0..1.",
                                  labels=jl)
        je = CounterMetricFamily("coloc_job_gpu_energy_joules", "GPU energy attributed to the job since the "
                                 "sampler first saw it (J; the Epilog's attribution rule).", labels=jl)
        for j in view.jobs:
            lab = [view.node, str(j.gpu), str(j.job_id), j.user, j.mode]
            used.add_metric(lab, j.mem_used_bytes)
            if j.mem_granted_bytes is not None:
                granted.add_metric(lab, j.mem_granted_bytes)
            if j.sm_util_ratio is not None:
                sm.add_metric(lab, j.sm_util_ratio)
            share.add_metric(lab, j.share_ratio)
            je.add_metric(lab, j.energy_j)
        return fams + [used, granted, sm, share, je]

    @staticmethod
    def _gl(view: View, g: GpuReading) -> List[str]:
        return [view.node, str(g.index), g.uuid or "", g.name or ""]

    def _jobstats(self, view: View) -> List[Metric]:
        labels = ["minor_number", "name", "uuid", "jobid"]
        names = (("nvidia_gpu_duty_cycle", "GPU utilization (%); per job: the GPU's x the job's share"),
                 ("nvidia_gpu_memory_used_bytes", "Memory used (bytes); per job: its processes'"),
                 ("nvidia_gpu_memory_total_bytes",
                  "Total memory (bytes); per job: the memory it was granted"),
                 ("nvidia_gpu_power_usage_milliwatts",
                  "Power usage (mW); per job: the GPU's x the job's share"),
                 ("nvidia_gpu_temperature_celsius", "Temperature of the GPU (Celsius)"),
                 ("nvidia_gpu_jobId", "Job id of a job using this GPU (one series per job on a shared GPU)"),
                 ("nvidia_gpu_jobUid", "Uid of the user of that job"))
        fams = {n: GaugeMetricFamily(n, h, labels=labels) for n, h in names}
        by_gpu = self._jobs_by_gpu(view)
        for g in view.gpus:
            r = g.reading
            base = [str(r.index), r.name or "", r.uuid or ""]
            rows: List[Tuple[str, float, float, Optional[float], int, int]] = [
                (str(j.job_id), j.share_ratio, j.mem_used_bytes, j.mem_granted_bytes, j.job_id, j.uid or 0)
                for j in by_gpu.get(r.index, [])] or [
                ("", 1.0, (r.mem_used_mib or 0.0) * MIB, None, 0, 0)]
            for jobid, share, used, total, job_id, uid in rows:
                lab = base + [jobid]
                if r.util_pct is not None:
                    fams["nvidia_gpu_duty_cycle"].add_metric(lab, r.util_pct * share)
                fams["nvidia_gpu_memory_used_bytes"].add_metric(lab, used)
                total = total if total is not None else (r.mem_total_mib or 0.0) * MIB
                fams["nvidia_gpu_memory_total_bytes"].add_metric(lab, total)
                if r.power_w is not None:
                    fams["nvidia_gpu_power_usage_milliwatts"].add_metric(lab, r.power_w * 1000.0 * share)
                if r.temp_c is not None:
                    fams["nvidia_gpu_temperature_celsius"].add_metric(lab, r.temp_c)
                fams["nvidia_gpu_jobId"].add_metric(lab, float(job_id))
                fams["nvidia_gpu_jobUid"].add_metric(lab, float(uid))
        n = GaugeMetricFamily("nvidia_gpu_num_devices", "Number of GPU devices")
        n.add_metric([], float(len(view.gpus)))
        return [n, *fams.values()]

    def _dcgm(self, view: View) -> List[Metric]:
        labels = ["gpu", "UUID", "device", "modelName", "Hostname", "hpc_job"]
        fams = {name: GaugeMetricFamily(name, h, labels=labels) for name, _, _, _, h in _DCGM}
        for name, h in (("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB); per job: its processes'."),
                        ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB); per job: granted - used."),
                        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                         "Total energy consumption since boot (in mJ); "
                         "per job: attributed since the sampler first saw it.")):
            fams[name] = GaugeMetricFamily(name, h, labels=labels)
        by_gpu = self._jobs_by_gpu(view)
        for g in view.gpus:
            r = g.reading
            base = [str(r.index), r.uuid or "", f"nvidia{r.index}", r.name or "", view.node]
            total_mib = r.mem_total_mib or 0.0
            jobs = by_gpu.get(r.index, [])
            rows: List[Tuple[str, float, float, float, Optional[float]]] = [
                (str(j.job_id), j.share_ratio, j.mem_used_bytes / MIB,
                 (j.mem_granted_bytes / MIB if j.mem_granted_bytes is not None else total_mib),
                 j.energy_j * 1000.0) for j in jobs] or [
                ("", 1.0, r.mem_used_mib or 0.0, total_mib, None if r.energy_j is None
                 else r.energy_j * 1000.0)]
            for job, share, used_mib, cap_mib, energy_mj in rows:
                lab = base + [job]
                for name, attr, scale, split, _ in _DCGM:
                    x = _v(r, attr, scale)
                    if x is not None:
                        fams[name].add_metric(lab, x * share if split else x)
                fams["DCGM_FI_DEV_FB_USED"].add_metric(lab, used_mib)
                fams["DCGM_FI_DEV_FB_FREE"].add_metric(lab, max(0.0, cap_mib - used_mib))
                if energy_mj is not None:
                    fams["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].add_metric(lab, energy_mj)
        return list(fams.values())

    @staticmethod
    def _jobs_by_gpu(view: View) -> Dict[int, List[JobGpuView]]:
        out: Dict[int, List[JobGpuView]] = {}
        for j in view.jobs:
            out.setdefault(j.gpu, []).append(j)
        return out


class Exporter:
    """One sampler's endpoint: a registry (our collector + process metrics) and its HTTP server thread."""

    def __init__(self, cfg: Config, state: LiveState) -> None:
        self.cfg, self.state = cfg, state
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = ColocCollector(state, cfg.exporter_names, ctld_oom_counts(cfg))
        self.registry.register(self.collector)  # type: ignore[arg-type]
        ProcessCollector(registry=self.registry)
        self.server: Any = None
        self._stop = threading.Event()
        self._retry: Optional[threading.Thread] = None

    def start(self) -> bool:
        """Serve ``/metrics``; on failure log one line and retry every ``BIND_RETRY_S`` in a daemon thread."""
        if self._bind():
            return True
        self._retry = threading.Thread(target=self._retry_loop, name="coloc-exporter-bind", daemon=True)
        self._retry.start()
        return False

    def _bind(self, first: bool = True) -> bool:
        addr, port = self.cfg.exporter_bind_address, self.cfg.exporter_port
        try:
            self.server, _ = metrics_server.serve(make_wsgi_app(self.registry), addr, port)  # bounded
        except (OSError, ValueError) as exc:
            if first:
                log.error("metrics: cannot serve http://%s:%d/metrics (%s); sampling goes on without it, "
                          "binding "
                          "retried every %.0f s", addr, port, getattr(exc, "strerror", None) or exc,
                          BIND_RETRY_S)
            return False
        log.info("metrics: serving http://%s:%d/metrics (%s names)", addr, port, self.cfg.exporter_names)
        return True

    def _retry_loop(self) -> None:
        while not self._stop.wait(BIND_RETRY_S):
            if self._bind(first=False):
                return

    def stop(self) -> None:
        """Stop serving (the sampler is exiting)."""
        self._stop.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def start(cfg: Config, node: str, interval_s: Optional[float] = None) -> Tuple[Optional[LiveState],
                                                                              Optional[Exporter]]:
    """``(LiveState, Exporter)`` for ``node``, the exporter started (perhaps still retrying its bind);
    ``(None, None)`` when ``exporter_port`` is 0. ``interval_s`` (staleness) None: ``sampler_interval_s``.
    """
    if not cfg.exporter_port:
        return None, None
    state = LiveState(cfg, node, node_job_rows(cfg, node), interval_s)
    exp = Exporter(cfg, state)
    exp.start()
    return state, exp
