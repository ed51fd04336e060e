"""The public probe corpus (benchmarks/probe_public): the manifest is complete and the stand-in data is in the
formats the upstream scripts read (torchvision's MNIST and ImageFolder, nanoGPT's memmap + meta.pkl,
Lightning's MNIST .pt, a GLUE-style CSV). No upstream code is needed: the data is read back with the libraries
themselves."""
from __future__ import annotations

import os
import pickle
import re

import numpy as np
import pytest

from benchmarks.probe_public import setup_corpus, standin

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "probe_public")


def test_manifest_names_pinned_upstream_scripts_and_known_data() -> None:
    man = setup_corpus.load_manifest()
    scripts = man["scripts"]
    assert len(scripts) >= 20
    assert len({s["name"] for s in scripts}) == len(scripts)
    upstream = [s for s in scripts if man["repos"][s["repo"]].get("origin") != "ours"]
    assert len(upstream) >= 20
    for key, spec in man["repos"].items():
        if spec.get("origin") == "ours":
            assert all(os.path.isfile(os.path.join(HERE, spec["local"], p)) for p in spec["paths"])
        else:
            assert re.fullmatch(r"[0-9a-f]{40}", spec["commit"]), key
            assert spec["mirror"] and spec["paths"], key
    kinds = set(standin.GENERATORS) | {"site"}
    for s in scripts:
        assert s["command"].split()[0] in ("python", "torchrun"), s["name"]
        assert all(d["kind"] in kinds for d in s.get("data") or []), s["name"]
    assert set(man["eval_markers"]) <= {s["name"] for s in scripts}
    for pat in man["eval_markers"].values():
        re.compile(pat)
    covered = {man["repos"][s["repo"]].get("repo") for s in scripts}
    assert {"pytorch/examples", "karpathy/nanoGPT", "huggingface/pytorch-image-models", "pytorch/vision",
            "karpathy/minGPT", "Lightning-AI/pytorch-lightning"} <= covered


def test_job_text_is_an_ordinary_batch_script() -> None:
    s = {"name": "x", "command": "python train.py --a 1", "pre": ["export A=$PWD/b"]}
    text = setup_corpus.job_text(s, "/opt/v", "00:10:00")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash" and "#SBATCH --gres=gpu:1" in lines
    assert lines[-3:] == ["source /opt/v/bin/activate", "export A=$PWD/b", "python train.py --a 1"]
    assert "#COLOC" not in text
    assert "export PATH=/opt/v/bin:$PATH" in setup_corpus.job_text(s, "/opt/v", "00:10:00", activate="path")


def test_mnist_raw_reads_with_torchvision(tmp_path) -> None:
    from torchvision import datasets
    standin.mnist_raw(str(tmp_path))
    train = datasets.MNIST(str(tmp_path), train=True, download=False)
    test = datasets.MNIST(str(tmp_path), train=False, download=False)
    assert (len(train), len(test)) == (2048, 1024)
    img, label = train[0]
    assert img.size == (28, 28) and 0 <= label < 10


def test_image_folder_reads_with_torchvision(tmp_path) -> None:
    from torchvision import datasets
    standin.image_folder(str(tmp_path))
    train = datasets.ImageFolder(str(tmp_path / "train"))
    val = datasets.ImageFolder(str(tmp_path / "val"))
    assert (len(train), len(val), len(train.classes)) == (320, 256, 10)
    assert train[0][0].size == (96, 96)


def test_nanogpt_char_memmap_and_meta(tmp_path) -> None:
    standin.nanogpt_char(str(tmp_path))
    data = np.memmap(tmp_path / "train.bin", dtype=np.uint16, mode="r")
    with open(tmp_path / "meta.pkl", "rb") as fh:
        meta = pickle.load(fh)
    assert meta["vocab_size"] == 65 and len(meta["stoi"]) == 65
    assert len(data) == 1_003_854 and int(data.max()) < 65


def test_lightning_mnist_pt_loads_weights_only(tmp_path) -> None:
    import torch
    standin.lightning_mnist(str(tmp_path))
    data, targets = torch.load(tmp_path / "MNIST" / "complete" / "training.pt", weights_only=True)
    assert data.shape == (2048, 28, 28) and data.dtype == torch.uint8 and targets.shape == (2048,)


def test_generators_are_deterministic(tmp_path) -> None:
    standin.glue_csv(str(tmp_path / "a"))
    standin.glue_csv(str(tmp_path / "b"))
    a = (tmp_path / "a" / "dev.csv").read_bytes()
    assert a == (tmp_path / "b" / "dev.csv").read_bytes()
    assert a.startswith(b"sentence,label\n") and a.count(b"\n") == 513


def test_setup_refuses_a_missing_mirror(tmp_path) -> None:
    with pytest.raises(SystemExit, match="no mirror"):
        setup_corpus.main(["--mirror-dir", str(tmp_path), "--out", str(tmp_path / "out"), "pe_mnist"])
    assert not os.path.exists(tmp_path / "out")


def test_fenced_device_reads_whole_gpu_from_the_comment() -> None:
    from types import SimpleNamespace

    from benchmarks.probe_public import fenced_device
    from slurm_coloc.comment import build_comment

    shared = SimpleNamespace(comment=build_comment({"mode": "shard", "mem_mib": 958, "shards": 2}),
                             gres={"shard": 2})
    whole = SimpleNamespace(comment=build_comment({"mode": "whole-gpu", "shards": 80}), gres={"shard": 80})
    plain = SimpleNamespace(comment="", gres={"gpu": 1})
    assert [fenced_device.whole_gpu(j) for j in (shared, whole, plain)] == [False, True, True]
    row = {"script": "pe_mnist", "unfenced": False, "estimate_mib": 958, "grant_mib": 2048,
           "nvml_peak_mib": 1300,
           "peak_over_grant_pct": 63.5, "state": "CANCELLED", "reached_eval": True, "outcome": "OK"}
    last = fenced_device.table([row]).splitlines()[-1]
    assert last == "| pe_mnist | 958 | 2048 | 1300 | 63.5 | CANCELLED | yes | OK |"
