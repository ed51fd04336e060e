"""Single-node multi-process training in the probe: ``torch.multiprocessing.spawn`` and
``multiprocessing.Process`` workers with an NCCL or Gloo group on one node are traced as one process (the
per-GPU figure); more processes than the one GPU fall back with the reason; a worker's failure is named by the
worker's own exception, never the launcher's ``ProcessRaisedException`` (real CPU torch, the real probe child;
one test with a real ``torch.multiprocessing.spawn`` of a failing worker in this process).
"""
from __future__ import annotations

import pytest
import torch.multiprocessing as tmp

from slurm_coloc.probe.inject.report import reason_of
from tests.test_probe_cuda_paths import job_env  # noqa: F401  (autouse: the job's PATH, a fresh cache)
from tests.test_probe_gpu_only import probe

pytestmark = pytest.mark.slow  # real probe/torch/subprocess work: left out of the fast command

MOCO = """
    import argparse
    import torch, torch.nn as nn
    import torch.distributed as dist
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", default=-1, type=int)
    parser.add_argument("--rank", default=-1, type=int)
    parser.add_argument("--dist-url", default="tcp://localhost:10001")
    parser.add_argument("--dist-backend", default="{backend}")
    parser.add_argument("--multiprocessing-distributed", action="store_true")
    parser.add_argument("--lr", default=0.03, type=float)

    def main_worker(gpu, ngpus_per_node, args):
        args.rank = args.rank * ngpus_per_node + gpu
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                world_size=args.world_size, rank=args.rank)
        torch.cuda.set_device(gpu)
        model = nn.Sequential(nn.Linear(512, 4096), nn.ReLU(), nn.Linear(4096, 128)).cuda(gpu)
        model = nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
        opt = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9)
        {fail}
        for _ in range(4):
            x = torch.randn(64, 512).cuda(gpu, non_blocking=True)
            loss = model(x).logsumexp(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    if __name__ == "__main__":
        args = parser.parse_args()
        ngpus_per_node = {nprocs}
        args.world_size = ngpus_per_node * args.world_size
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
"""
ARGS = ("--multiprocessing-distributed", "--world-size", "1", "--rank", "0", "--lr", "0.1")


def _moco(backend="nccl", nprocs="torch.cuda.device_count()", fail=""):
    return MOCO.format(backend=backend, nprocs=nprocs, fail=fail)


def test_spawn_with_nccl_one_gpu_is_the_per_process_figure(tmp_path):
    r = probe(tmp_path, "main_moco", _moco(), *ARGS)
    assert r.estimate is not None, (r.reason, r.log_text[-2000:])
    assert r.detail["nccl_group"] is True and r.estimate.detail.get("nccl_mib", 0) > 0
    assert r.detail["peak_allocated_b"] >= 2 * 4 * (512 * 4096 + 4096 * 128)  # weights + gradients at least
    assert any("torch.multiprocessing.spawn of 1 process" in n for n in r.detail["notes"])


def test_spawn_with_gloo_one_gpu(tmp_path):
    r = probe(tmp_path, "main_gloo", _moco(backend="gloo"), *ARGS)
    assert r.estimate is not None, (r.reason, r.log_text[-2000:])
    assert not r.detail.get("nccl_group")


def test_spawn_of_more_processes_than_gpus_falls_back_with_the_reason(tmp_path):
    r = probe(tmp_path, "main_four", _moco(nprocs="4"), *ARGS)
    assert r.estimate is None
    expected = "the program starts 4 worker processes (torch.multiprocessing.spawn)"
    assert r.reason.startswith(expected), r.reason
    assert "\n" not in r.reason


def test_a_failing_workers_own_exception_is_the_reason(tmp_path):
    r = probe(tmp_path, "main_fail", _moco(fail="raise KeyError('no such dataset split: train2')"), *ARGS)
    assert r.estimate is None
    assert "ProcessRaisedException" not in r.reason
    assert "main_fail.py:" in r.reason and "KeyError: 'no such dataset split: train2'" in r.reason, r.reason


def test_process_workers_with_their_own_model(tmp_path):
    body = """
        import torch, torch.nn as nn
        import torch.distributed as dist
        import torch.multiprocessing as mp

        def run(rank, world):
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29555", rank=rank, world_size=world)
            model = nn.Linear(2048, 2048).cuda()
            opt = torch.optim.Adam(model.parameters())
            for _ in range(3):
                model(torch.randn(32, 2048, device="cuda")).sum().backward()
                opt.step()

        if __name__ == "__main__":
            procs = [mp.Process(target=run, args=(r, 1)) for r in range(1)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
    """
    r = probe(tmp_path, "proc_workers", body)
    assert r.estimate is not None, (r.reason, r.log_text[-2000:])
    assert r.detail["peak_allocated_b"] >= 4 * 4 * 2048 * 2048  # weights, gradients, two Adam moments
    assert any("multiprocessing.Process(run)" in n for n in r.detail["notes"])


def _failing_worker(rank: int) -> None:
    raise ValueError("ProcessGroupNCCL is only supported with GPUs, no GPUs found!")


def test_reason_of_a_real_spawn_failure_names_the_workers_error():
    try:
        tmp.spawn(_failing_worker, nprocs=1)
    except Exception as exc:  # torch.multiprocessing.spawn.ProcessRaisedException
        assert type(exc).__name__ == "ProcessRaisedException"
        line = reason_of(exc)
    assert line.startswith("the program's worker process 0 reached the real CUDA driver at "
                           "test_probe_workers.py:"), line
    assert "(ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!)" in line, line


def _failing_on_data(rank: int) -> None:
    raise KeyError("no such split: train2")


def test_reason_of_a_real_spawn_failure_names_the_workers_own_error():
    try:
        tmp.spawn(_failing_on_data, nprocs=1)
    except Exception as exc:
        line = reason_of(exc)
    assert line.startswith("the program's worker process 0 failed at test_probe_workers.py:"), line
    assert line.endswith("KeyError: 'no such split: train2'"), line
    assert "ProcessRaisedException" not in line


def test_a_driver_error_is_never_the_reason_as_the_driver_gave_it():
    """A CUDA call the fake GPU misses reaches the real driver here (no GPU): the line says so."""
    import torch

    try:
        torch.cuda.FloatTensor(2)  # the real constructor: this process has no fake GPU
    except RuntimeError as exc:
        line = reason_of(exc)
    assert line.startswith("the program reached the real CUDA driver at test_probe_workers.py:"), line
    assert "does not imitate" in line and "the job itself has a GPU" in line


def test_the_programs_threads_are_capped_in_the_probe(tmp_path):
    body = """
        import torch
        torch.set_num_threads(16)
        print("threads", torch.get_num_threads(), flush=True)
        m = torch.nn.Linear(64, 64).cuda()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            m(torch.randn(8, 64).cuda()).sum().backward()
            opt.step()
    """
    r = probe(tmp_path, "threads", body)
    assert r.estimate is not None, r.reason
    assert "threads 2" in r.log_text, r.log_text[-500:]
    assert any("torch.set_num_threads(16): 2 in the probe" in n for n in r.detail["notes"])
