"""find_command on batch script texts (pure: no process runs)."""
from __future__ import annotations

import os

from slurm_coloc.probe.command import find_command

SUB = "/home/u/proj"


def cmd(text, args=(), sub=SUB):
    res = find_command(text, args, submit_dir=sub)
    assert res.command is not None, res.reason
    return res.command


def test_plain_python_file_and_args():
    c = cmd("#!/bin/bash\n#SBATCH --gres=gpu:1\npython train.py --batch-size 128 --epochs 1\n")
    assert (c.mode, c.target, c.args, c.interpreter, c.launcher) == (
        "file", f"{SUB}/train.py", ("--batch-size", "128", "--epochs", "1"), "python", "python")


def test_python3_module_and_flags():
    c = cmd("python3 -u -W ignore -m mypkg.train --lr 0.1\n")
    assert (c.mode, c.target, c.args) == ("module", "mypkg.train", ("--lr", "0.1"))


def test_srun_with_options_and_redirect():
    c = cmd("srun --ntasks=1 -c 4 --gres gpu:1 python main.py -a resnet50 -b 256 > log.txt 2>&1\n")
    assert c.launcher == "srun" and c.target == f"{SUB}/main.py"
    assert c.args == ("-a", "resnet50", "-b", "256")


def test_script_arguments_substituted():
    c = cmd('python train.py --model "$1" "$@"\n', args=("convnext_tiny", "--amp"))
    assert c.args == ("--model", "convnext_tiny", "convnext_tiny", "--amp")
    c = cmd("python train.py ${1:-64} $2\n", args=())
    assert c.args == ("64",)


def test_variables_before_command():
    c = cmd("BS=256\nexport LR=0.1\nDATA=${DATA:-/data/in}\npython train.py -b $BS --lr ${LR} $DATA\n")
    assert c.args == ("-b", "256", "--lr", "0.1", "/data/in")


def test_venv_activation_and_cd():
    c = cmd("cd $SLURM_SUBMIT_DIR/run\nsource ../venv/bin/activate\npython train.py\n")
    assert c.interpreter == f"{SUB}/venv/bin/python"
    assert c.workdir == f"{SUB}/run" and c.target == f"{SUB}/run/train.py"
    c = cmd(". venv/bin/activate && python x.py\n")
    assert c.interpreter == f"{SUB}/venv/bin/python"


def test_interpreter_by_path_and_coloc_override():
    c = cmd("./env/bin/python3 train.py\n")
    assert c.interpreter == f"{SUB}/env/bin/python3"
    c = cmd("#COLOC python=/opt/py/bin/python\nsource venv/bin/activate\npython train.py\n")
    assert c.interpreter == "/opt/py/bin/python"


def test_line_continuation():
    c = cmd("python train.py \\\n  --epochs 2 \\\n  --amp\n")
    assert c.args == ("--epochs", "2", "--amp")


def test_torchrun_one_process_and_env():
    c = cmd("torchrun --standalone --nproc_per_node=1 train.py --compile\n")
    assert c.launcher == "torchrun" and c.args == ("--compile",)
    env = dict(c.env)
    assert env["WORLD_SIZE"] == "1" and env["RANK"] == "0"
    c = cmd("python -m torch.distributed.run --nproc-per-node 1 train.py\n")
    assert c.launcher == "torchrun" and c.target.endswith("train.py")


def test_torchrun_many_processes_is_refused():
    res = find_command("torchrun --nproc_per_node=4 train.py\n", (), SUB)
    assert res.command is None and "4 processes" in res.reason


def test_accelerate_launch():
    c = cmd("accelerate launch --num_processes 1 --mixed_precision fp16 train.py --epochs 1\n")
    assert c.launcher == "accelerate" and dict(c.env)["ACCELERATE_MIXED_PRECISION"] == "fp16"
    assert c.args == ("--epochs", "1")
    res = find_command("accelerate launch --multi_gpu train.py\n", (), SUB)
    assert res.command is None and "multi-GPU" in res.reason


def test_env_prefix_and_exec():
    c = cmd("OMP_NUM_THREADS=4 exec python train.py\n")
    assert c.target.endswith("train.py")


def test_first_command_wins_when_none_reads_like_training():
    c = cmd("echo start\nnvidia-smi\npython prep.py\npython train.py\n")  # no files to read: the first
    assert c.target.endswith("prep.py")


def test_the_command_whose_program_trains_wins(tmp_path):
    """pytorch/examples' time_sequence_prediction: generate the data, then train (only the second is
    probed)."""
    (tmp_path / "generate_sine_wave.py").write_text("import torch\ntorch.save(torch.randn(3), "
                                                    "'traindata.pt')\n")
    (tmp_path / "train.py").write_text("import torch\nopt = torch.optim.LBFGS([])\nloss.backward()\n")
    (tmp_path / "eval.py").write_text("import torch\nmodel.eval()\n")
    res = find_command("python generate_sine_wave.py\npython train.py --steps 2\npython eval.py\n", (),
                       submit_dir=str(tmp_path))
    assert res.command is not None and res.command.target == str(tmp_path / "train.py")
    assert res.command.args == ("--steps", "2")
    assert res.notes == ("3 Python commands in the script; probed the first whose program trains: "
                         "python train.py --steps 2",)
    one = find_command("python train.py\n", (), submit_dir=str(tmp_path))
    assert one.notes == ()


def test_no_command_reasons():
    assert "no python" in find_command("#!/bin/bash\necho hi\n./a.out\n", (), SUB).reason
    assert "inline code" in find_command("python -c 'print(1)'\n", (), SUB).reason
    assert find_command("", (), SUB).command is None


def test_comment_and_pipe():
    c = cmd("python train.py --x 1  # the run\n")
    assert c.args == ("--x", "1")
    c = cmd("python train.py | tee out.log\n")
    assert c.args == ()


def test_relative_submit_dir_made_absolute(tmp_path):
    c = find_command("python t.py\n", (), str(tmp_path)).command
    assert c is not None and os.path.isabs(c.workdir)


def test_default_values_and_the_submitting_environment():
    """``${X:-$SLURM_SUBMIT_DIR/dir}`` substitutes inside the default; a variable of the submitting
    environment (sbatch exports it to the job) is used as the job would see it."""
    text = ('EXAMPLES=${COLOC_EXAMPLES:-$SLURM_SUBMIT_DIR/examples}\n'
            'exec "${PYTHON:-python3}" "$EXAMPLES/train_digits.py" "$@"\n')
    c = find_command(text, ("--epochs", "2"), SUB, environ={}).command
    assert (c.target, c.interpreter, c.args) == (f"{SUB}/examples/train_digits.py", "python3",
                                                 ("--epochs", "2"))
    c = find_command(text, (), SUB,
                     environ={"COLOC_EXAMPLES": "/opt/ex", "PYTHON": "/opt/py/bin/python"}).command
    assert (c.target, c.interpreter) == ("/opt/ex/train_digits.py", "/opt/py/bin/python")
