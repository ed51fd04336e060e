"""Programs the probe cannot follow fall back with one clear line: worker processes on the GPU, unreadable
exception messages (the probe corpus: pytorch/examples mnist_hogwild, time_sequence_prediction)."""
from __future__ import annotations

import pickle

import pytest

from slurm_coloc.probe.inject.report import REASON_CHARS, reason_of
from tests.test_probe_cuda_paths import job_env  # noqa: F401  (autouse: the job's PATH, a fresh cache)
from tests.test_probe_gpu_only import probe

HOGWILD = """
    import sys
    import torch, torch.nn as nn
    import torch.multiprocessing as mp

    def train(rank, model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(8, 16).cuda()).sum().backward()
            opt.step()

    def cpu_helper(n):
        return n

    if __name__ == "__main__":
        mp.set_start_method("spawn", force=True)
        helper = mp.Process(target=cpu_helper, args=(3,))   # given no GPU data: starts as usual
        helper.start()
        helper.join()
        if helper.exitcode != 0:
            raise SystemExit("the CPU helper failed")
        model = nn.Linear(16, 4).cuda()
        model.share_memory()
        procs = [mp.Process(target=train, args=(r, model)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
"""


@pytest.mark.slow
def test_worker_processes_on_the_gpu_fall_back_with_the_reason(tmp_path):
    r = probe(tmp_path, "hogwild", HOGWILD)
    assert r.estimate is None
    expected = "the program starts worker processes that use the GPU (Process(target=train)"
    assert r.reason.startswith(expected), (r.reason, r.log_text[-2000:])
    assert "\n" not in r.reason


def test_a_long_coloured_message_is_cut_to_its_first_sentence():
    msg = ("Weights only load failed. This file can still be loaded, to do so you have two options, "
           "\x1b[1mdo those steps only if you trust the source of the checkpoint\x1b[0m. (1) In PyTorch 2.6, "
           "we changed the default value of the `weights_only` argument in `torch.load` from `False` to "
           "`True`.")
    try:
        raise pickle.UnpicklingError(msg)
    except pickle.UnpicklingError as exc:
        line = reason_of(exc)
    assert line.startswith("the program failed")
    assert "UnpicklingError: Weights only load failed. (torch >= 2.6 loads with weights_only=True" in line
    assert "\x1b" not in line and "[1m" not in line and "two options" not in line
    try:
        raise ValueError("x" * 1000)
    except ValueError as exc:
        line = reason_of(exc)
    assert line.endswith("x...") and len(line.split("ValueError: ")[1]) == REASON_CHARS
