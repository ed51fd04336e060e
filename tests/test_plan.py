"""The GPU translation rule and the sbatch argv (pure)."""
from __future__ import annotations

import pytest

from slurm_coloc.comment import build_comment, parse_comment
from slurm_coloc.config import Config
from slurm_coloc.errors import ConfigError, DirectiveError
from slurm_coloc.estimate.spec import Estimate
from slurm_coloc.submit.directives import parse_script
from slurm_coloc.submit.plan import build_plan
from slurm_coloc.submit.request import split_command_line

CFG = Config(gpu_mem_gib=80, headroom_mib=256)
MODEL = "#COLOC model=m:f input=3 batch=2\n"


def plan_for(tmp_path, argv, script_text="#!/bin/sh\n" + MODEL + "true\n", estimate_mib=None, cfg=CFG,
             calls=None):
    """Plan ``argv`` (``SCRIPT`` = the script's path) with an estimator that answers ``estimate_mib`` for
    every GPU model and appends the model names it was asked for to ``calls``."""
    p = tmp_path / "job.sh"
    p.write_text(script_text)
    cmd = split_command_line([a.replace("SCRIPT", str(p)) for a in argv])

    def estimate_fn(spec, gpu_model):
        if calls is not None:
            calls.append(gpu_model)
        return Estimate(estimate_mib, "analytic", gpu_model=gpu_model)

    return build_plan(cmd, parse_script(str(p)), cfg, estimate_fn if estimate_mib is not None else None)


def test_estimate_to_shards(tmp_path):
    plan = plan_for(tmp_path, ["-t", "5", "SCRIPT", "--epochs", "3"], estimate_mib=3000)
    assert plan.mode == "shard" and plan.shards == 4  # ceil((3000 + 256) / 1024)
    args = plan.argv(None)
    assert args[:2] == ["-t", "5"] and "--gres=shard:4" in args and args[-2:] == ["--epochs", "3"]
    written = next(a for a in args if a.startswith("--comment="))
    comment = parse_comment(written)
    assert comment["mem_mib"] == 3000 and comment["argv"] == ["--epochs", "3"]
    assert comment == plan.comment and written == plan.coloc.comment_arg()  # nothing dropped: as planned
    assert plan.coloc.mem_mib == 3000 and plan.coloc.argv == ("--epochs", "3") and comment["gpus"] is None


def test_one_gpu_request_becomes_shards(tmp_path):
    text = "#!/bin/sh\n#SBATCH --gpus=1 -t 7\n" + MODEL + "true\n"
    plan = plan_for(tmp_path, ["SCRIPT"], script_text=text, estimate_mib=1000)
    assert plan.shards == 2 and plan.rewritten_script is not None
    assert "#SBATCH --gpus=1" not in plan.rewritten_script
    args = plan.argv("/tmp/copy.sh")
    assert "-t" in args and "7" in args and "--job-name=job.sh" in args and "--gres=shard:2" in args


def test_no_model_gets_whole_gpu(tmp_path):
    plan = plan_for(tmp_path, ["SCRIPT"], script_text="#!/bin/sh\ntrue\n")
    assert plan.mode == "whole-gpu" and plan.shards == 80


def test_too_big_estimate_gets_whole_gpu(tmp_path):
    plan = plan_for(tmp_path, ["SCRIPT"], estimate_mib=90_000)
    assert plan.mode == "whole-gpu" and plan.shards == 80


@pytest.mark.parametrize("argv, mode, shards", [
    (["--exclusive-gpu", "SCRIPT"], "whole-gpu", 80),
    (["--coloc-mem", "6G", "SCRIPT"], "shard", 6),  # an override is exact: no headroom
    (["--coloc-mem=512M", "SCRIPT"], "shard", 1),
    (["--gres=shard:3", "SCRIPT"], "shard", 3),
])
def test_own_options(tmp_path, argv, mode, shards):
    plan = plan_for(tmp_path, argv, estimate_mib=1)
    assert (plan.mode, plan.shards) == (mode, shards)
    assert not any(a.startswith("--coloc") or a == "--exclusive-gpu" for a in plan.argv(None))


@pytest.mark.parametrize("argv",
                         [["--gres=gpu:2", "SCRIPT"], ["-G", "2", "SCRIPT"], ["--gpus-per-task=1", "SCRIPT"]])
def test_multi_gpu_keeps_gpus_and_exclusive_node(tmp_path, argv):
    calls = []
    plan = plan_for(tmp_path, argv, estimate_mib=1000, calls=calls)
    assert plan.mode == "gpu" and "--exclusive" in plan.argv(None)
    assert calls == []  # rule 3 needs no estimate


@pytest.mark.parametrize("gpu_opts",
                         [["--gpus-per-task=2"], ["--gpus-per-socket=1"], ["--gpus-per-task", "2"],
                                      ["--gres=gpu:a100:2,tmpdisk:10"]])
def test_multi_gpu_submits_the_users_own_gpu_options(tmp_path, gpu_opts):
    plan = plan_for(tmp_path, ["-n", "2", *gpu_opts, "SCRIPT", "x"], estimate_mib=1000)
    args = plan.argv("/s.sh")
    comment = next(a for a in args if a.startswith("--comment="))
    assert args == ["-n", "2", *gpu_opts, "--exclusive", comment, "/s.sh", "x"]
    assert plan.gpu_args == (*gpu_opts, "--exclusive") and plan.mode == "gpu"
    assert parse_comment(comment)["mode"] == "gpu"
    assert plan.reason.startswith("more than one GPU per node" if "gres" in gpu_opts[0]
                                  else "a per-task/per-socket")


def test_multi_gpu_from_script_lines_last_of_each_option_wins(tmp_path):
    text = ("#!/bin/sh\n#SBATCH --gpus-per-task=4 -t 9\n#SBATCH --gpus-per-socket=1 --exclusive\n"
            + MODEL + "true\n")
    plan = plan_for(tmp_path, ["--gpus-per-task", "2", "SCRIPT"], script_text=text)
    args = plan.argv("/copy.sh")
    comment = next(a for a in args if a.startswith("--comment="))
    # the commented-out lines' other options move to the command line; the command line's option wins
    assert args == ["-t", "9", "--exclusive", "--gpus-per-socket=1", "--gpus-per-task", "2", comment,
                    "--job-name=job.sh", "/copy.sh"]
    assert "#SBATCH --gpus-per-task" not in plan.rewritten_script


def test_gpu_model_by_partition(tmp_path):
    cfg = Config(gpu_model="H100", gpu_model_by_partition={"old": "a100", "new": "H200"})
    calls = []
    plan = plan_for(tmp_path, ["-p", "old", "SCRIPT"], estimate_mib=1000, cfg=cfg, calls=calls)
    assert calls == ["A100"] and plan.comment["gpu_model"] == "A100" and "on A100" in plan.reason
    text = "#!/bin/sh\n#SBATCH --partition=new\n" + MODEL + "true\n"
    calls.clear()
    plan_for(tmp_path, ["SCRIPT"], script_text=text, estimate_mib=1000, cfg=cfg, calls=calls)
    assert calls == ["H200"]
    calls.clear()
    plan_for(tmp_path, ["--partition=new", "SCRIPT"], script_text=text.replace("=new", "=old"),
             estimate_mib=1000,
             cfg=cfg, calls=calls)
    assert calls == ["H200"]  # the command line wins over #SBATCH
    calls.clear()
    plan_for(tmp_path, ["-p", "other", "SCRIPT"], estimate_mib=1000, cfg=cfg, calls=calls)
    assert calls == ["H100"]  # an unmapped partition: gpu_model


def test_several_partitions_take_the_largest_estimate(tmp_path):
    p = tmp_path / "job.sh"
    p.write_text("#!/bin/sh\n" + MODEL + "true\n")
    cfg = Config(gpu_model_by_partition={"a": "A100", "b": "A100", "h": "H100"})
    cmd = split_command_line(["-p", "a,h,b", str(p)])
    calls = []

    def estimate_fn(spec, gpu_model):
        calls.append(gpu_model)
        return Estimate({"A100": 5000, "H100": 3000}[gpu_model], "analytic", gpu_model=gpu_model)

    plan = build_plan(cmd, parse_script(str(p)), cfg, estimate_fn)
    assert calls == ["A100", "H100"] and plan.comment["mem_mib"] == 5000 and plan.shards == 6


def test_unknown_gpu_model_names_the_config_key(tmp_path):
    with pytest.raises(ConfigError, match="'gpu_model_by_partition'.*unknown GPU model 'B300'"):
        plan_for(tmp_path, ["-p", "x", "SCRIPT"], estimate_mib=1,
                 cfg=Config(gpu_model_by_partition={"x": "B300"}))
    with pytest.raises(ConfigError, match="'gpu_model'.*unknown GPU model"):
        plan_for(tmp_path, ["SCRIPT"], estimate_mib=1, cfg=Config(gpu_model="V100"))
    assert plan_for(tmp_path, ["SCRIPT"],
                    cfg=Config(gpu_model="V100")).mode == "whole-gpu"  # no estimate: no check


def test_user_comment_kept(tmp_path):
    plan = plan_for(tmp_path, ["--comment", "my run", "SCRIPT"], estimate_mib=10)
    comment = next(a for a in plan.argv(None) if a.startswith("--comment="))
    assert comment.startswith("--comment=my run coloc:{")


def test_bad_coloc_mem(tmp_path):
    with pytest.raises(DirectiveError, match="--coloc-mem"):
        plan_for(tmp_path, ["--coloc-mem", "-3G", "SCRIPT"])


def test_no_script():
    with pytest.raises(DirectiveError, match="no job script"):
        split_command_line(["-t", "5"])
    with pytest.raises(DirectiveError, match="needs a value"):
        split_command_line(["-t"])


def test_comment_round_trip():
    data = {"v": 1, "mode": "shard", "argv": ["a b", "c"]}
    assert parse_comment(build_comment(data)) == data
    assert build_comment(data, "my run").startswith("my run coloc:{")
    assert parse_comment(build_comment(data, "x coloc:{\"v\":9}")) == data  # the last coloc JSON counts


def test_parse_comment_never_raises():
    assert parse_comment(None) is None
    assert parse_comment("") is None
    assert parse_comment("coloc:{broken") is None
    assert parse_comment("coloc:[1]") is None
    assert parse_comment('x coloc:{"a":1}') == {"a": 1}
    assert parse_comment('coloc:' + '[' * 100000) is None


def test_spank_plugin_options_passed_on(tmp_path):
    p = tmp_path / "job.sh"
    p.write_text("#!/bin/sh\ntrue\n")
    cmd = split_command_line(["--coloc-mem", "6G", str(p)])
    plan = build_plan(cmd, parse_script(str(p)), CFG, spank=True)
    assert "--coloc-mem=6144M" in plan.argv(None) and "--gres=shard:6" in plan.argv(None)
    cmd = split_command_line(["--exclusive-gpu", str(p)])
    assert "--coloc-share=exclusive" in build_plan(cmd, parse_script(str(p)), CFG, spank=True).argv(None)
    assert not any(a.startswith("--coloc") for a in build_plan(cmd, parse_script(str(p)), CFG).argv(None))


def test_wrap_takes_its_command():
    for argv in (["--wrap", "sleep 3"], ["--wrap=sleep 3"]):
        cmd = split_command_line(argv)
        assert cmd.script is None and cmd.script_args == () and cmd.last("wrap") == "sleep 3"
