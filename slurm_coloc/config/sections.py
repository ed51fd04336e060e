"""The config's keys, one frozen dataclass per section (``SECTIONS``), which ``slurm_coloc.config.Config``
joins.

Each key declares its default and its valid values together (``_key``: bounds, choices, not empty); the
meaning of each key is in its section's docstring. ``slurm_coloc.config.checks`` reads those declarations.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

MPS_MODES = ("multi-user", "per-user", "off")
EXPORTER_NAMES = ("coloc", "jobstats", "dcgm")
PLACEMENT_MODES = ("spread", "consolidate")
PLACEMENT_POLICIES: List[str] = ["throughput", "gate"]
"""The valid ``placement_policy`` values: the names in ``slurm_coloc.placement.policies.POLICIES`` (the
registry; its ``register`` appends here). Listed because the config layer may not import the placement one
and must accept the built-in names before that is imported (tests/test_placement_policies.py checks they
agree)."""
COMPUTE_MODE_CHOICES = ("leave", "exclusive-process")
WATCHDOG_ACTIONS = ("stop", "record", "off")
ADMIN_COMMENT_MODES = ("merge", "if-empty", "off")
MAX_TIMEOUT_S = 3600.0  # the most any hook-side wait or estimate/probe limit may be (s)
GPM_MIN_INTERVAL_S = 0.1  # NVML GPM samples need at least this period (s)


def _key(default: Any = None, *, ge: Optional[float] = None, gt: Optional[float] = None,
         le: Optional[float] = None, choices: Sequence[str] = (), nonempty: bool = False, why: str = "",
         factory: Optional[Callable[[], Any]] = None) -> Any:
    """A config key: its default (or ``factory`` for a mutable one) and its valid values, checked by
    ``_validate``.

    Args:
        ge, gt, le: bounds (>=, >, <=) of a number.
        choices: the only values a text key may take.
        nonempty: the text must hold more than whitespace.
        why: said after a bound in the error (``GPM minimum``).
    """
    meta = {"ge": ge, "gt": gt, "le": le, "choices": choices, "nonempty": nonempty, "why": why}
    if factory is not None:
        return field(default_factory=factory, hash=False, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class SiteConfig:
    """Site: where slurm-coloc keeps its state and finds Slurm.

    Attributes:
        state_dir: root-owned directory of the databases: ``ctld.db`` and ``nodes/<node>.db``.
        run_dir: root-owned runtime directory (MPS pipes/logs, per-job env files).
        log_dir: where hooks and the sampler log (``hooks.log``).
        slurm_bin_dir: directory of sbatch/scontrol/squeue (hooks get no PATH).
        admin_group: Unix group whose members see every job in coloc-report (root always does).
        db_busy_timeout_s: how long a writer waits for a locked database (s, 0-3600).
    """

    state_dir: str = "/var/lib/slurm-coloc"
    run_dir: str = "/run/slurm-coloc"
    log_dir: str = "/var/log/slurm-coloc"
    slurm_bin_dir: str = "/usr/bin"
    admin_group: str = ""
    db_busy_timeout_s: float = _key(5.0, ge=0, le=MAX_TIMEOUT_S)


@dataclass(frozen=True)
class SubmitConfig:
    """Submission (coloc-sbatch): how a memory figure becomes a shard request.

    Attributes:
        gpu_mem_gib: memory per GPU in GiB = shards per GPU (1 shard = 1 GiB; 1-4096).
        headroom_mib: added to every estimate before rounding up to shards.
        min_shards: smallest shard request for a job with an estimate.
    """

    gpu_mem_gib: int = _key(80, ge=1, le=4096)
    headroom_mib: int = _key(256, ge=0)
    min_shards: int = _key(1, ge=1)


@dataclass(frozen=True)
class EstimateConfig:
    """Estimate: the GPU models figures are made for, the ``#COLOC model=`` estimate and the script probe.

    Attributes:
        gpu_model: the GPU model estimates are made for (a name ``estimate/spec.py`` knows: ``H100``,
            ``H200``, ``A100``), for jobs whose partition ``gpu_model_by_partition`` does not name.
        gpu_model_by_partition: partition name -> GPU model of its nodes. In YAML a mapping
            (``{a100: A100}``); in ``COLOC_GPU_MODEL_BY_PARTITION`` (or a YAML string)
            ``part=model,part=model``.
        estimate_timeout_s: how long coloc-sbatch lets the estimate (which imports the user's model) run
            before it kills it and submits as without an estimate (a whole GPU; s, up to 3600).
        probe: run the script probe (``on``/``off``): coloc-sbatch runs the batch script's training program on
            fake tensors to estimate its GPU memory (docs/user.md "The script probe").
        probe_timeout_s: the probe's wall-clock limit (s, up to 3600); a program that has not stepped by then
            falls back.
        probe_mem_limit_mib: the probe's address-space limit (``RLIMIT_AS``, MiB, at least 1024).
    """

    gpu_model: str = _key("H100", nonempty=True)
    gpu_model_by_partition: Dict[str, str] = _key(factory=dict)
    estimate_timeout_s: float = _key(60.0, gt=0, le=MAX_TIMEOUT_S)
    probe: bool = True
    probe_timeout_s: float = _key(30.0, gt=0, le=MAX_TIMEOUT_S)
    probe_mem_limit_mib: int = _key(32768, ge=1024)


@dataclass(frozen=True)
class HookConfig:
    """Hooks: their time bound, the OOM rerun and the job's AdminComment.

    Attributes:
        hook_timeout_s: the bound a hook's own work must keep (s, up to 3600; the shim kills it later).
        oom_rerun_per_user_max: the most OOM reruns on a whole GPU one user gets per ``oom_rerun_window_s``
            (0: none at all).
        oom_rerun_window_s: the sliding window of ``oom_rerun_per_user_max`` (s).
        oom_rerun_tolerance_pct: how close to its grant (% of the grant, at least 256 MiB) the sampler must
            have seen a shard job's GPU memory (plus the allocation its OOM message says failed) for an OOM
            rerun.
        admin_comment: how the job summary goes into the job's AdminComment (hooks/ctld.py):
            ``merge`` (another tool's text is kept and ours follows it; a jobstats ``JS1:`` summary, which
            jobstats decodes as the whole field, is left alone), ``if-empty`` (only into an empty field or one
            holding only ours), ``off`` (never; the summary stays in ctld.db and coloc-report).
    """

    hook_timeout_s: float = _key(20.0, gt=0, le=MAX_TIMEOUT_S)
    oom_rerun_per_user_max: int = _key(3, ge=0)
    oom_rerun_window_s: float = _key(3600.0, gt=0)
    oom_rerun_tolerance_pct: float = _key(10.0, ge=0, le=100)
    admin_comment: str = _key("merge", choices=ADMIN_COMMENT_MODES)


@dataclass(frozen=True)
class MpsConfig:
    """Node: CUDA MPS on shared GPUs (the Prolog and Epilog).

    Attributes:
        mps_mode: ``multi-user`` | ``per-user`` | ``off`` (docs/admin.md explains each).
        mps_control_bin: ``nvidia-cuda-mps-control`` (searched in PATH and the NVIDIA/CUDA bin dirs) or a
            path.
        mps_keep_warm: keep a GPU's MPS daemon running after its last shared job ends.
        mps_start_timeout_s: how long the Prolog waits for an MPS daemon to come up or go down (s, up to
            3600).
        mps_ceiling: give each MPS control daemon a per-client pinned memory ceiling = the largest grant among
            the jobs it serves (``set_default_device_pinned_mem_limit`` / ``set_device_pinned_mem_limit``;
            docs/node.md "What MPS enforces").
        mps_compute_mode: ``leave`` (never touch the compute mode) | ``exclusive-process`` (the Prolog sets a
            GPU to EXCLUSIVE_PROCESS when its first shard job starts and restores the previous mode when its
            last one ends; multi-user MPS only).
    """

    mps_mode: str = _key("multi-user", choices=MPS_MODES)
    mps_control_bin: str = _key("nvidia-cuda-mps-control", nonempty=True)
    mps_keep_warm: bool = False
    mps_start_timeout_s: float = _key(5.0, gt=0, le=MAX_TIMEOUT_S)
    mps_ceiling: bool = True
    mps_compute_mode: str = _key("leave", choices=COMPUTE_MODE_CHOICES)


@dataclass(frozen=True)
class SamplerConfig:
    """Node: the NVML sampler and its watchdog.

    Attributes:
        sampler_interval_s: NVML sampling period (s; GPM needs >= 0.1 s).
        sampler_autostart: the Prolog starts ``coloc-sampler`` when none runs on the node.
        sampler_batch_s: the sampler writes its buffered rows once per this many seconds (one transaction).
        sampler_raw_retention_h: raw samples older than this are folded into ``sampler_downsample_s`` rows (h;
            at most 24 x ``sampler_retention_days``).
        sampler_downsample_s: resolution of folded old samples (s).
        sampler_retention_days: samples older than this are deleted (job summaries stay).
        sampler_replay_path: CI/demo only: replay this NVML recording instead of reading NVML.
        watchdog_action: what the sampler's watchdog does to a job over its grant or outside MPS on a shared
            GPU: ``stop`` (SIGKILL its GPU processes, scancel, tell the user, record), ``record`` (record
            only), ``off``.
        watchdog_tolerance_mib: memory a job may use above its grant before the watchdog acts (MiB).
        watchdog_interval_s: the sampler's period while a shard job runs on the node (s, at least 0.1; the
            lower of this and ``sampler_interval_s``).
        watchdog_fast_interval_s: the period while a tenant is above ``watchdog_near_pct`` of its grant or a
            suspicion awaits its confirming read (s, at least 0.1).
        watchdog_near_pct: share of its grant above which a tenant makes the sampler read at the fast rate
            (%).
    """

    sampler_interval_s: float = _key(1.0, ge=GPM_MIN_INTERVAL_S, why="GPM minimum")
    sampler_autostart: bool = True
    sampler_batch_s: float = _key(1.0, gt=0)  # = sampler_interval_s: a SIGKILL loses at most one interval
    sampler_raw_retention_h: float = _key(24.0, gt=0)
    sampler_downsample_s: float = _key(60.0, gt=0)
    sampler_retention_days: float = 30.0
    sampler_replay_path: str = ""
    watchdog_action: str = _key("stop", choices=WATCHDOG_ACTIONS)
    watchdog_tolerance_mib: int = _key(512, ge=0)
    watchdog_interval_s: float = _key(0.5, ge=GPM_MIN_INTERVAL_S, why="GPM minimum")
    watchdog_fast_interval_s: float = _key(0.1, ge=GPM_MIN_INTERVAL_S, why="GPM minimum")
    watchdog_near_pct: float = _key(90.0, gt=0, le=100)


@dataclass(frozen=True)
class MetricsConfig:
    """Metrics: the sampler's Prometheus endpoint.

    Attributes:
        exporter_port: TCP port of the sampler's Prometheus endpoint ``/metrics``; 0 turns it off.
        exporter_bind_address: address the endpoint binds to (default ``127.0.0.1``: the node itself; set the
            node's management address, or ``0.0.0.0``, for a central Prometheus: the series carry user names
            and job ids).
        exporter_names: metric names and labels: ``coloc`` (docs/metrics.md), ``jobstats`` or ``dcgm`` (the
            names and labels of jobstats' GPU exporter or of dcgm-exporter, with per-job series on shared
            GPUs).
    """

    exporter_port: int = _key(9466, ge=0, le=65535, why="0: off")
    exporter_bind_address: str = "127.0.0.1"
    exporter_names: str = _key("coloc", choices=EXPORTER_NAMES)


@dataclass(frozen=True)
class PlacementConfig:
    """Placement: coloc-placer's policy, its CARMA gate and its timing.

    Attributes:
        placement_policy: ``throughput`` (default: pack each GPU while the predicted slowdown of every job on
            it stays within ``placement_max_slowdown``, from measured activity alone and the fitted sharing
            model, ``placement/share.py``; the gate only where a job has no measured data) or ``gate`` (the
            CARMA gate over live + predicted activity for every job).
        placement_max_slowdown: the ``throughput`` policy's bound on a job's predicted slowdown while it
            shares a GPU (x its speed alone; 1.0-10.0; 1.2 favours latency, 3 throughput).
        placement_history_max_age_s: measured runs (and a ``placement_history_path`` file) older than this are
            stale and ignored (s).
        placement_mode: coloc-placer's order among GPUs that qualify (``gate`` policy): ``spread`` (least
            loaded first) or ``consolidate`` (most loaded that stays under the gate first, for energy).
        placement_smact_gate, placement_smocc_gate, placement_drama_gate: the saturation gate (fractions 0..1,
            CARMA): a GPU is saturated when SMACT >= smact_gate and (SMOCC >= smocc_gate or DRAMA >=
            drama_gate).
        placement_window_s: live state of a GPU = mean of its samples over this window before its last sample
            (s).
        placement_state_max_age_s: a GPU whose last sample is older than this is placed by memory only (s).
        placement_recent_s: a job the placer sent to a GPU counts with its predicted activity for this long,
            on top of the GPU's live state, while it starts and before its work shows in the samples (s; 0 =
            the value of ``placement_window_s``). Long enough and the GPU takes no new tenant while the last
            ones start; shorter and the next job's start-up (imports, CUDA set-up) overlaps the others' work.
        placement_interval_s: coloc-placer's loop period (s).
        placement_max_wait_s: a held job waiting longer than this is placed by memory only (s): never blocks.
        placement_calibration_path: JSON coefficients of the intensity predictor ("" = the packaged defaults).
        placement_history_path: JSON of activity measured alone elsewhere (another cluster, an earlier
            database), by job signature (``{"signatures": {sig: {"smact", "smocc", "drama"[, "run_s",
            "startup_s"]}}}``, fractions and seconds; an optional ``"gpu_models": {"NVIDIA H200": {sig:
            {...}}}`` holds runs on a named GPU model, used first on GPUs of that model), read by coloc-placer
            as one more earlier run of each signature ("" = none; written by ``benchmarks/device`` tools).
    """

    placement_policy: str = _key("throughput", choices=PLACEMENT_POLICIES)
    placement_max_slowdown: float = _key(2.0, ge=1.0, le=10.0)
    placement_history_max_age_s: float = _key(30 * 86400.0, gt=0)
    placement_mode: str = _key("spread", choices=PLACEMENT_MODES)
    placement_smact_gate: float = _key(0.8, gt=0, le=1)
    placement_smocc_gate: float = _key(0.45, gt=0, le=1)
    placement_drama_gate: float = _key(0.4, gt=0, le=1)
    placement_window_s: float = _key(30.0, gt=0)
    placement_state_max_age_s: float = _key(60.0, gt=0)
    placement_recent_s: float = _key(0.0, ge=0, why="0 = placement_window_s")
    placement_interval_s: float = _key(2.0, gt=0)
    placement_max_wait_s: float = _key(600.0, gt=0)
    placement_calibration_path: str = ""
    placement_history_path: str = ""


@dataclass(frozen=True)
class ReportConfig:
    """Report: coloc-report's reader service, its waste flags and its per-job findings.

    Attributes:
        report_socket_path: Unix socket of the reader service (``coloc-report serve``) that answers ordinary
            users' coloc-report with their own rows; empty: ``<run_dir>/report.sock``.
        report_waste_smact_pct: coloc-report flags a job whose mean SM activity is below this (%).
        report_waste_unused_pct: coloc-report flags a job that left more than this share of its request unused
            (%).
        report_waste_min_runtime_s: jobs shorter than this are never flagged as wasteful (s).
        diag_*: thresholds of the per-job findings of coloc-report (report/diagnose.py; docs/report.md,
            "Findings"): ``diag_min_runtime_s`` / ``diag_min_samples`` (shorter or fewer: no finding),
            ``diag_idle_smact_pct`` (a sample below this SM activity is idle), ``diag_input_bound_smact_pct``
            / ``diag_input_bound_idle_pct``, ``diag_no_tensor_min_smact_pct`` /
            ``diag_no_tensor_max_tensor_pct``, ``diag_low_occupancy_smocc_pct`` /
            ``diag_low_occupancy_min_smact_pct`` / ``diag_small_batch``, ``diag_over_request_ratio`` (request
            / (peak + headroom) at or above this); the CPU evidence: ``diag_loader_busy_pct`` (loader workers
            using at least this % of one core each, or the job's processes this % of its CPUs, are saturated),
            ``diag_train_waiting_cores`` (a training process using at most this many cores waits),
            ``diag_train_busy_cores`` (at least this: it is busy itself: launching kernels, or loading data
            without workers), ``diag_input_bound_self_idle_pct`` (a job without loader workers reads as
            loading its data itself only when the GPU idled in at least this % of its samples). Percentages
            are 0-100.
    """

    report_socket_path: str = ""
    report_waste_smact_pct: float = 10.0
    report_waste_unused_pct: float = 50.0
    report_waste_min_runtime_s: float = 300.0
    diag_min_runtime_s: float = _key(30.0, ge=0)
    diag_min_samples: int = _key(20, ge=1)
    diag_idle_smact_pct: float = _key(1.0, ge=0, le=100)
    diag_input_bound_smact_pct: float = _key(10.0, ge=0, le=100)
    diag_input_bound_idle_pct: float = _key(30.0, ge=0, le=100)
    diag_input_bound_self_idle_pct: float = _key(60.0, ge=0, le=100)
    diag_no_tensor_min_smact_pct: float = _key(40.0, ge=0, le=100)
    diag_no_tensor_max_tensor_pct: float = _key(1.0, ge=0, le=100)
    diag_low_occupancy_smocc_pct: float = _key(10.0, ge=0, le=100)
    diag_low_occupancy_min_smact_pct: float = _key(2.0, ge=0, le=100)
    diag_small_batch: int = _key(8, ge=1)
    diag_over_request_ratio: float = _key(2.0, gt=1)
    diag_loader_busy_pct: float = _key(80.0, ge=0, le=100)
    diag_train_waiting_cores: float = _key(0.5, ge=0)
    diag_train_busy_cores: float = 0.8


SECTIONS: Tuple[type, ...] = (SiteConfig, SubmitConfig, EstimateConfig, HookConfig, MpsConfig, SamplerConfig,
                              MetricsConfig, PlacementConfig, ReportConfig)
"""The sections in the order ``fields(Config)`` and the sample ``coloc.yaml`` list them."""


def section_of(name: str) -> type:
    """The section dataclass (of ``SECTIONS``) that declares key ``name``.

    Args:
        name: a configuration key (``state_dir``, ``hook_timeout_s``, ...).

    Returns:
        The section's class.

    Raises:
        KeyError: an unknown key.
    """
    for section in SECTIONS:
        if name in section.__dataclass_fields__:  # type: ignore[attr-defined]
            return section
    raise KeyError(name)
