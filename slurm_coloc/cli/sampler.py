"""``coloc-sampler``: the node NVML sampler daemon (run), an NVML recorder (record) and a status check."""
from __future__ import annotations

import json
import logging
import socket
import sys
import time
from typing import Dict, Optional

import click

from slurm_coloc import config as config_mod
from slurm_coloc.cli import setup_logging, version_option
from slurm_coloc.errors import ColocError


def _cfg() -> config_mod.Config:
    """The config; on a config error one line on stderr and exit 2 (the units' RestartPreventExitStatus=2: a
    unit started before its config exists says so once instead of restarting every few seconds)."""
    try:
        return config_mod.load()
    except ColocError as exc:
        click.echo(f"coloc-sampler: error: {exc.one_line()}", err=True)
        sys.exit(2)


def _logging(cfg: config_mod.Config, node: str, to_file: bool) -> None:
    setup_logging(cfg.log_dir, "coloc-sampler", f"sampler-{node}.log" if to_file else None)


def _pid_map(text: str) -> Dict[int, int]:
    out = {}
    for item in filter(None, (text or "").split(",")):
        a, sep, b = item.partition("=")
        if not (sep and a.isdigit() and b.isdigit()):
            raise click.BadParameter(f"{item!r} is not RECORDED_PID=LIVE_PID", param_hint="--pid-map")
        out[int(a)] = int(b)
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("coloc-sampler")
def cli() -> None:
    """The slurm-coloc node sampler (NVML + GPM, per GPU and per job).

    \b
    Examples:
      coloc-sampler run --node n1                 # the daemon (started by the Prolog or systemd)
      coloc-sampler status --node n1
      coloc-sampler record --out h100.jsonl --seconds 30
    """


@cli.command()
@click.option("--node", default=lambda: socket.gethostname().split(".")[0], show_default="short hostname",
              help="Slurm node name (selects nodes/<node>.db and the lock file).")
@click.option("--interval-s", type=float, default=None, help="Override sampler_interval_s (>= 0.1).")
@click.option("--duration-s", type=float, default=None,
              help="Stop after this many seconds (default: run forever).")
@click.option("--replay", type=click.Path(dir_okay=False), default=None,
              help="Replay this NVML recording instead of live NVML (CI/demo only).")
@click.option("--pid-map", default="", help="With --replay: RECORDED=LIVE[,...] pid substitutions.")
@click.option("--foreground-log", is_flag=True, help="Log to stderr instead of <log_dir>/sampler-<node>.log.")
def run(node: str, interval_s: Optional[float], duration_s: Optional[float], replay: Optional[str],
        pid_map: str,
        foreground_log: bool) -> None:
    """Sample every interval into the node database; exits 0 at once if a sampler already runs.

    \b
    Example:
      coloc-sampler run --node n1 --interval-s 1

    \f
    Args:
        node: ``--node``: the Slurm node name.
        interval_s: ``--interval-s`` (s, >= 0.1), or None: the config's ``sampler_interval_s``.
        duration_s: ``--duration-s`` (s), or None: run until stopped.
        replay: ``--replay``: an NVML recording to replay, or None: live NVML.
        pid_map: ``--pid-map``: ``RECORDED=LIVE[,...]``; foreground_log: ``--foreground-log``.

    Raises:
        click.BadParameter: ``interval_s < 0.1``; click.ClickException: no NVML reader (one line, exit 1).
    """
    from slurm_coloc.node import sampler as sm
    from slurm_coloc.node import sampler_daemon
    cfg = _cfg()
    if interval_s is not None and interval_s < 0.1:
        raise click.BadParameter("must be >= 0.1 (GPM minimum)", param_hint="--interval-s")
    _logging(cfg, node, not foreground_log)
    log = logging.getLogger("slurm_coloc.sampler")
    fd = sampler_daemon.take_lock(cfg, node)
    if fd is None:
        log.info("another sampler holds %s; exiting", sampler_daemon.lock_path(cfg, node))
        return
    try:
        reader = sm.make_reader(cfg, replay, _pid_map(pid_map))
    except ColocError as exc:
        log.error("%s", exc.one_line())
        raise click.ClickException(exc.one_line()) from None
    from slurm_coloc.node import exporter
    try:
        live, endpoint = exporter.start(cfg, node, interval_s)
    except Exception as exc:  # the metrics endpoint never stops the sampler
        log.error("metrics: endpoint not started (%s: %s); sampling goes on", type(exc).__name__, exc)
        live, endpoint = None, None
    s = sm.Sampler(cfg, node, reader, interval_s=interval_s, live=live)
    sm.install_signal_handlers(s)
    log.info("sampling node %s every %.2f s into %s", node, s.interval_s, s.db_path)
    try:
        s.run(duration_s=duration_s)
    finally:
        if endpoint is not None:
            endpoint.stop()
    log.info("stopped: %d frames, %d read errors, %d flushes, %d rows dropped", s.frames, s.errors, s.flushes,
             s.dropped)


@cli.command()
@click.option("--node", default=lambda: socket.gethostname().split(".")[0], show_default="short hostname")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(node: str, as_json: bool) -> None:
    """Whether a sampler runs on NODE and how many samples its database holds.

    \b
    Example:
      coloc-sampler status --node n1 --json

    \f
    Args:
        node: ``--node``: the Slurm node name; as_json: ``--json``.

    Raises:
        SystemExit: exit 1 when no sampler runs on ``node``.
    """
    from slurm_coloc.node import sampler_daemon
    from slurm_coloc.store import samples as st
    from slurm_coloc.store.db import open_readonly
    cfg = _cfg()
    pid = sampler_daemon.running_pid(cfg, node)
    counts: Dict[str, int] = {}
    try:
        counts = st.count_samples(open_readonly(cfg.node_db_path(node)))
    except ColocError:
        pass
    data = {"node": node, "running": bool(pid), "pid": pid, **counts}
    click.echo(json.dumps(data) if as_json else " ".join(f"{k}={v}" for k, v in data.items()))
    if not pid:
        sys.exit(1)


@cli.command()
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="JSON-lines file to write.")
@click.option("--seconds", type=float, default=30.0, show_default=True)
@click.option("--interval-s", type=float, default=1.0, show_default=True)
@click.option("--label", default="", help="What ran on the GPU while recording (stored in the header).")
def record(out_path: str, seconds: float, interval_s: float, label: str) -> None:
    """Record live NVML frames (the replay format of tests/data/nvml/).

    \b
    Example:
      coloc-sampler record --out tests/data/nvml/h100.jsonl --seconds 20 --label "2 torch jobs under MPS"

    \f
    Args:
        out_path: ``--out``: the JSON-lines file (a header line, then one frame per line).
        seconds: ``--seconds``: how long to record (s); interval_s: ``--interval-s`` (s, >= 0.1).
        label: ``--label``: what ran on the GPU, stored in the header.

    Raises:
        click.BadParameter: ``interval_s < 0.1``; click.ClickException: NVML not available (one line, exit 1).
        OSError: ``out_path`` cannot be written.
    """
    from slurm_coloc.nvml import NvmlReader
    if interval_s < 0.1:
        raise click.BadParameter("must be >= 0.1 (GPM minimum)", param_hint="--interval-s")
    try:
        reader = NvmlReader()
    except ColocError as exc:
        raise click.ClickException(exc.one_line()) from None
    t0 = time.time()
    frames = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        frames.append(reader.read().to_json(t0))
        time.sleep(interval_s)
    names = sorted({g["name"] for f in frames for g in f["gpus"] if g.get("name")})
    header = {"recording": f"NVML readings recorded live on {', '.join(names) or 'unknown GPU'}",
              "label": label, "host": socket.gethostname(), "start_ts": t0, "interval_s": interval_s,
              "frames": len(frames)}
    with open(out_path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(header) + "\n")
        for f in frames:
            fh.write(json.dumps(f) + "\n")
    click.echo(f"wrote {len(frames)} frames to {out_path}")


def main() -> None:
    """Console-script entry."""
    cli.main(prog_name="coloc-sampler")


if __name__ == "__main__":
    main()
