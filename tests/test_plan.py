"""The GPU translation rule and the sbatch argv (pure)."""
from __future__ import annotations

import pytest

from slurm_coloc.config import Config
from slurm_coloc.errors import DirectiveError
from slurm_coloc.estimate.spec import Estimate
from slurm_coloc.submit.argv import split_command_line
from slurm_coloc.submit.directives import parse_script
from slurm_coloc.submit.plan import build_plan, gpu_request, needs_estimate, parse_comment, script_options

CFG = Config(gpu_mem_gib=80, headroom_mib=256)
MODEL = "#COLOC model=m:f input=3 batch=2\n"


def plan_for(tmp_path, argv, script_text="#!/bin/sh\n" + MODEL + "true\n", estimate_mib=None):
    p = tmp_path / "job.sh"
    p.write_text(script_text)
    cmd = split_command_line([a.replace("SCRIPT", str(p)) for a in argv])
    parsed = parse_script(str(p))
    req = gpu_request(script_options(parsed)[0] + list(cmd.options))
    est = Estimate(estimate_mib, "analytic") if estimate_mib is not None and needs_estimate(cmd, parsed, req) else None
    return build_plan(cmd, parsed, est, CFG)


def test_estimate_to_shards(tmp_path):
    plan = plan_for(tmp_path, ["-t", "5", "SCRIPT", "--epochs", "3"], estimate_mib=3000)
    assert plan.mode == "shard" and plan.shards == 4  # ceil((3000 + 256) / 1024)
    args = plan.argv(None)
    assert args[:2] == ["-t", "5"] and "--gres=shard:4" in args and args[-2:] == ["--epochs", "3"]
    comment = parse_comment(next(a for a in args if a.startswith("--comment=")))
    assert comment["mem_mib"] == 3000 and comment["argv"] == ["--epochs", "3"]


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


@pytest.mark.parametrize("argv", [["--gres=gpu:2", "SCRIPT"], ["-G", "2", "SCRIPT"], ["--gpus-per-task=1", "SCRIPT"]])
def test_multi_gpu_keeps_gpus_and_exclusive_node(tmp_path, argv):
    plan = plan_for(tmp_path, argv)
    assert plan.mode == "gpu" and "--exclusive" in plan.argv(None)


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


def test_parse_comment_never_raises():
    assert parse_comment("") is None
    assert parse_comment("coloc:{broken") is None
    assert parse_comment("coloc:[1]") is None
    assert parse_comment('x coloc:{"a":1}') == {"a": 1}
    assert parse_comment('coloc:' + '[' * 100000) is None


def test_spank_plugin_options_passed_on(tmp_path):
    p = tmp_path / "job.sh"
    p.write_text("#!/bin/sh\ntrue\n")
    cmd = split_command_line(["--coloc-mem", "6G", str(p)])
    plan = build_plan(cmd, parse_script(str(p)), None, CFG, spank=True)
    assert "--coloc-mem=6144M" in plan.argv(None) and "--gres=shard:6" in plan.argv(None)
    cmd = split_command_line(["--exclusive-gpu", str(p)])
    assert "--coloc-share=exclusive" in build_plan(cmd, parse_script(str(p)), None, CFG, spank=True).argv(None)
    assert not any(a.startswith("--coloc") for a in build_plan(cmd, parse_script(str(p)), None, CFG).argv(None))


def test_wrap_takes_its_command():
    for argv in (["--wrap", "sleep 3"], ["--wrap=sleep 3"]):
        cmd = split_command_line(argv)
        assert cmd.script is None and cmd.script_args == () and cmd.last("wrap") == "sleep 3"
