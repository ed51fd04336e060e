"""deploy/: the Grafana dashboard parses and queries only metrics the exporter serves; the scrape config
parses.

The exporter's output comes from the live state fed with the H100 NVML recording (tests/data/nvml, labelled
there), a real node database with two running jobs, and a real controller database holding one OOM rerun.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Set

import yaml
from prometheus_client import generate_latest

from slurm_coloc.node import exporter, livestate
from slurm_coloc.node.livestate import LiveState
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store.db import open_ctld_db
from slurm_coloc.store.samples import ProcSample
from tests.test_exporter import _cfg, _feed, _start

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "deploy" / "grafana" / "slurm-coloc.json"
METRIC = re.compile(r"\b(coloc_[a-z0-9_]+)\b")


def _exposed(tmp_path: Path) -> Set[str]:
    cfg = _cfg(tmp_path)
    _start(cfg, 9101, 2)
    _start(cfg, 9102, 4)
    store_oom.claim_retry(open_ctld_db(cfg.ctld_db_path), store_oom.OomRecord(
        job_id=9101, ts=time.time(), retry_status="submitted"))
    state = LiveState(cfg, "e1", livestate.node_job_rows(cfg, "e1"), interval_s=0.5)
    frames = _feed(state, 4)
    # SM utilization per job exists only where NVML gives it per process (not MPS clients): the recorded
    # process that reports it stands in for a job running without MPS.
    state.observe(frames[-1], [ProcSample(p, 9103 if p.pid == 2374 else None) for p in frames[-1].procs])
    reg = exporter.CollectorRegistry(auto_describe=False)
    reg.register(exporter.ColocCollector(state, "coloc", livestate.ctld_oom_counts(cfg)))
    text = generate_latest(reg).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line
            and not line.startswith("#")}


def _exprs(dash: dict) -> list:
    out = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    out += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    return out


def test_dashboard_parses_and_every_queried_metric_is_served(tmp_path: Path) -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["panels"]
    exprs = _exprs(dash)
    queried = {m for e in exprs for m in METRIC.findall(e)}
    assert {"coloc_job_gpu_memory_granted_bytes", "coloc_job_gpu_memory_used_bytes",
            "coloc_gpu_sm_active_ratio",
            "coloc_gpu_tenants",
            "coloc_oom_reruns_total"} <= queried  # estimate vs used, SM, tenants, OOM reruns
    missing = queried - _exposed(tmp_path)
    assert not missing, f"the dashboard queries metrics the exporter does not serve: {sorted(missing)}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_scrape_config_parses_and_names_the_default_port() -> None:
    conf = yaml.safe_load((REPO / "deploy" / "prometheus" / "scrape.yml").read_text())
    job = conf["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics"
    port = exporter.Config().exporter_port
    assert all(t.endswith(f":{port}") for sc in job["static_configs"] for t in sc["targets"])
