"""Measure what CUDA MPS itself enforces about client memory, and what NVML sees of it (device, root).

Scenarios (each with its own pipe directory; the GPU's compute mode and other settings are never touched):

* ``env_fence`` / ``env_override``: the client's own ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (the Prolog's fence) and a
  client that raises it (the attack).
* ``default_limit``: ``set_default_device_pinned_mem_limit 0 <v>`` given to the control daemon before any server:
  can a client raise it by its environment, is a lower value of its own kept, is the limit per client or shared.
* ``server_limit``: ``set_device_pinned_mem_limit <server pid> 0 <v>`` on a running server, then raised: does it
  apply to clients that connect afterwards / already connected.
* ``escape``: a client whose ``CUDA_MPS_PIPE_DIRECTORY`` names an empty directory (no MPS) beside a running server:
  what NVML's process lists show, so a watchdog can find it.
* ``kill``: an honest neighbour trains (matmul loop) while an offender allocates 20 GiB and is SIGKILLed: the
  neighbour's throughput per 0.25 s and whether it survives; NVML visibility delay of the offender's memory.
Each with ``-M`` (one server for all users) and, where it matters, without it.

Usage (device): ``python3 -m benchmarks.device.mps_limits --out $OUT/mps_limits.json``; prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

import pynvml

PY = os.environ.get("COLOC_TORCH_PY", "/opt/torch/.venv/bin/python3")
GIB = 1 << 30

CLIENT = r"""
import json, os, sys, time
import torch
spec = json.loads(sys.argv[1])
out = []
def say(**kw):
    kw["t"] = time.time(); kw["pid"] = os.getpid()
    print(json.dumps(kw), flush=True)
try:
    torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    say(ev="ctx", free_mib=free >> 20, total_mib=total >> 20)
except Exception as e:
    say(ev="ctx_error", err=str(e)[:200]); sys.exit(3)
keep = []
for g in spec.get("alloc_gib", []):
    try:
        keep.append(torch.empty(int(g * (1 << 30)), dtype=torch.uint8, device="cuda")); torch.cuda.synchronize()
        say(ev="alloc", gib=g, ok=True)
    except Exception as e:
        say(ev="alloc", gib=g, ok=False, err=type(e).__name__)
if spec.get("train_s"):
    a = torch.randn(4096, 4096, device="cuda"); b = torch.randn(4096, 4096, device="cuda")
    t0 = time.time(); last = t0; n = 0
    try:
        while time.time() - t0 < spec["train_s"]:
            c = a @ b; n += 1
            if n % 20 == 0:
                torch.cuda.synchronize()
                now = time.time()
                if now - last >= 0.25:
                    say(ev="rate", it=n); last = now
        torch.cuda.synchronize(); say(ev="done", it=n, ok=True)
    except Exception as e:
        say(ev="done", ok=False, err=str(e)[:200])
time.sleep(spec.get("hold_s", 0))
say(ev="exit")
"""


class Poller(threading.Thread):
    """Poll NVML's process lists every ``interval_s``; keep each pid's max memory and first time seen >= 1 GiB."""

    def __init__(self, handle: Any, interval_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.handle, self.interval_s = handle, interval_s
        self.stop_ev = threading.Event()
        self.seen: Dict[str, Dict[int, Dict[str, Any]]] = {"compute": {}, "mps": {}}
        self.call_us: List[float] = []

    def run(self) -> None:
        while not self.stop_ev.is_set():
            t0 = time.perf_counter()
            lists = {"compute": pynvml.nvmlDeviceGetComputeRunningProcesses(self.handle)}
            try:
                lists["mps"] = pynvml.nvmlDeviceGetMPSComputeRunningProcesses(self.handle)
            except pynvml.NVMLError:
                lists["mps"] = []
            self.call_us.append((time.perf_counter() - t0) * 1e6)
            now = time.time()
            for kind, procs in lists.items():
                for p in procs:
                    used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else None
                    rec = self.seen[kind].setdefault(p.pid, {"max_mib": None, "first_ge_1g": None, "first": now})
                    if used is not None:
                        rec["max_mib"] = max(rec["max_mib"] or 0, used >> 20)
                        if used >= GIB and rec["first_ge_1g"] is None:
                            rec["first_ge_1g"] = now
            time.sleep(self.interval_s)


class Mps:
    """One MPS control daemon in its own pipe/log directory."""

    def __init__(self, multiuser: bool) -> None:
        self.dir = tempfile.mkdtemp(prefix="mpsl-")
        os.chmod(self.dir, 0o755)
        self.env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=f"{self.dir}/pipe",
                        CUDA_MPS_LOG_DIRECTORY=f"{self.dir}/log")
        for d in ("pipe", "log"):
            os.makedirs(f"{self.dir}/{d}")
            os.chmod(f"{self.dir}/{d}", 0o755)
        subprocess.run(["nvidia-cuda-mps-control", "-d"] + (["-M"] if multiuser else []), env=self.env, check=True)

    def ctl(self, cmd: str) -> str:
        r = subprocess.run(["nvidia-cuda-mps-control"], input=cmd + "\n", env=self.env, capture_output=True,
                           text=True, timeout=20)
        return (r.stdout + r.stderr).strip()

    def quit(self) -> None:
        self.ctl("quit")
        time.sleep(1.0)
        shutil.rmtree(self.dir, ignore_errors=True)


def client(spec: Dict[str, Any], env: Dict[str, str], user: Optional[str] = None) -> subprocess.Popen:
    argv = [PY, "-c", CLIENT, json.dumps(spec)]
    if user:
        keep = [f"{k}={v}" for k, v in env.items() if k.startswith("CUDA_") or k in ("PATH", "LD_LIBRARY_PATH")]
        argv = ["runuser", "-u", user, "--", "env", "-i", "HOME=/tmp"] + keep + argv
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def events(p: subprocess.Popen, timeout_s: float = 120) -> List[Dict[str, Any]]:
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
    evs = []
    for line in out.splitlines():
        try:
            evs.append(json.loads(line))
        except ValueError:
            pass
    if p.returncode not in (0, None):
        evs.append({"ev": "rc", "rc": p.returncode, "stderr": err[-300:]})
    return evs


def allocs(evs: List[Dict[str, Any]]) -> str:
    return " ".join(f"{e['gib']}G:{'ok' if e['ok'] else 'OOM'}" for e in evs if e.get("ev") == "alloc") or \
        " ".join(str(e) for e in evs if e.get("ev") in ("ctx_error", "rc"))[:160]


def run_all(user: str) -> List[Dict[str, Any]]:
    rows: List[Dict[str, Any]] = []

    def row(name: str, mode: str, what: str, result: str, **extra: Any) -> None:
        rows.append(dict(scenario=name, mps=mode, what=what, result=result, **extra))
        print(f"{name:14s} {mode:4s} {what:58s} {result}", flush=True)

    for multi in (True, False):
        mode = "-M" if multi else "user"
        # 1. the client's own fence, and the attack that raises it
        m = Mps(multi)
        e = events(client({"alloc_gib": [4]}, dict(m.env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=2G")))
        row("env_fence", mode, "env 0=2G, alloc 4G", allocs(e))
        e = events(client({"alloc_gib": [20]}, dict(m.env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=70G")))
        row("env_override", mode, "env 0=70G (raised by the job), alloc 20G", allocs(e))
        m.quit()
        # 2. control daemon default limit, set before any server
        m = Mps(multi)
        r = m.ctl("set_default_device_pinned_mem_limit 0 2G")
        g = m.ctl("get_default_device_pinned_mem_limit 0")
        e = events(client({"alloc_gib": [1, 4]}, dict(m.env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=40G")))
        row("default_limit", mode, f"default 2G ({r or 'ok'}; get: {g}); env 0=40G, alloc 1G then 4G", allocs(e))
        e = events(client({"alloc_gib": [1.2]}, dict(m.env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=1G")))
        row("default_limit", mode, "default 2G; env 0=1G (lower), alloc 1.2G", allocs(e))
        unfenced = {k: v for k, v in m.env.items() if k != "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"}
        e = events(client({"alloc_gib": [4]}, unfenced))
        row("default_limit", mode, "default 2G; no env, alloc 4G", allocs(e))
        a = client({"alloc_gib": [1.2], "hold_s": 6}, m.env)
        time.sleep(3)
        b = client({"alloc_gib": [1.2], "hold_s": 1}, m.env)
        row("default_limit", mode, "default 2G; two clients at once, 1.2G each (per client?)",
            f"A {allocs(events(a))} | B {allocs(events(b))}")
        if multi:
            e = events(client({"alloc_gib": [1, 4]}, dict(m.env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=40G"), user=user))
            row("default_limit", mode, f"default 2G; other user {user}, env 0=40G, alloc 1G then 4G", allocs(e))
        m.quit()
        # 3. per-server limit on a running server, then raised
        m = Mps(multi)
        a = client({"alloc_gib": [1], "hold_s": 25}, m.env)
        time.sleep(6)
        servers = m.ctl("get_server_list").split()
        spid = servers[0] if servers else "?"
        r = m.ctl(f"set_device_pinned_mem_limit {spid} 0 3G")
        g = m.ctl(f"get_device_pinned_mem_limit {spid} 0")
        e = events(client({"alloc_gib": [2, 4]}, dict(m.env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=40G")))
        row("server_limit", mode, f"server {spid} set 3G ({r or 'ok'}; get: {g}); new client env 40G, 2G then 4G",
            allocs(e))
        r2 = m.ctl(f"set_device_pinned_mem_limit {spid} 0 8G")
        e = events(client({"alloc_gib": [6]}, m.env))
        row("server_limit", mode, f"raised to 8G while running ({r2 or 'ok'}); new client alloc 6G", allocs(e))
        e = events(client({"alloc_gib": [2]}, dict(m.env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=1G")))
        row("server_limit", mode, "server 8G; env 0=1G (lower), alloc 2G", allocs(e))
        os.killpg(a.pid, signal.SIGKILL)
        events(a)
        m.quit()
    return rows


def escape_and_kill(handle: Any) -> List[Dict[str, Any]]:
    rows: List[Dict[str, Any]] = []
    m = Mps(True)
    m.ctl("set_default_device_pinned_mem_limit 0 30G")
    poll = Poller(handle)
    poll.start()
    neighbour = client({"alloc_gib": [8], "train_s": 14}, dict(m.env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=10G"))
    time.sleep(4)
    empty = tempfile.mkdtemp(prefix="mps-empty-")
    escaper = client({"alloc_gib": [20], "hold_s": 3}, dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=empty))
    esc_ev = events(escaper)
    offender = client({"alloc_gib": [20], "hold_s": 30}, dict(m.env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=70G"))
    # wait for its allocation line, then kill it (the watchdog's action)
    t_alloc = None
    assert offender.stdout is not None
    for line in offender.stdout:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("ev") == "alloc":
            t_alloc = ev["t"]
            break
    time.sleep(1.0)
    t_kill = time.time()
    os.killpg(offender.pid, signal.SIGKILL)
    offender.wait()
    nb = events(neighbour)
    time.sleep(0.5)
    poll.stop_ev.set()
    poll.join()
    servers = m.ctl("get_server_list").split()
    m.quit()
    rates = [(e["t"], e["it"]) for e in nb if e.get("ev") == "rate"]
    per_s = []
    for (t0, n0), (t1, n1) in zip(rates, rates[1:]):
        per_s.append({"t_rel_kill_s": round(t1 - t_kill, 2), "it_per_s": round((n1 - n0) / (t1 - t0), 1)})
    esc_pid = next((e["pid"] for e in esc_ev if "pid" in e), None)
    off_seen = poll.seen["mps"].get(offender.pid) or poll.seen["compute"].get(offender.pid) or {}
    rows.append({
        "scenario": "escape_kill",
        "escaper": {"allocs": allocs(esc_ev), "pid": esc_pid,
                    "in_compute_list": esc_pid in poll.seen["compute"], "in_mps_list": esc_pid in poll.seen["mps"],
                    "nvml_max_mib": (poll.seen["compute"].get(esc_pid) or {}).get("max_mib")},
        "mps_server_pids": servers,
        "compute_list_pids": {str(k): v["max_mib"] for k, v in poll.seen["compute"].items()},
        "mps_list_pids": {str(k): v["max_mib"] for k, v in poll.seen["mps"].items()},
        "offender_pid": offender.pid, "offender_alloc_t": t_alloc,
        "offender_nvml_first_ge_1g_delay_s": (round(off_seen["first_ge_1g"] - t_alloc, 3)
                                              if off_seen.get("first_ge_1g") and t_alloc else None),
        "neighbour_done": [e for e in nb if e.get("ev") in ("done", "rc")],
        "neighbour_rate": per_s,
        "nvml_two_list_call_us_median": sorted(poll.call_us)[len(poll.call_us) // 2] if poll.call_us else None,
    })
    print(json.dumps(rows[-1], indent=1), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--user", default="mpsuser")
    args = ap.parse_args()
    subprocess.run(["useradd", "-M", args.user], capture_output=True)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    mode = pynvml.nvmlDeviceGetComputeMode(handle)
    print(f"compute mode {mode} (left as it is); driver {pynvml.nvmlSystemGetDriverVersion()}", flush=True)
    rows = run_all(args.user)
    rows += escape_and_kill(handle)
    with open(args.out, "w") as f:
        json.dump({"compute_mode": mode, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
