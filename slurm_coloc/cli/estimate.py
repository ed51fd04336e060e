"""``coloc-estimate``: print the peak GPU memory a training job will hold (issue 3 interface)."""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Optional, Tuple

import click

from slurm_coloc.errors import ColocError, EstimateError

EXAMPLES = """
\b
Examples:
  coloc-estimate --model torchvision.models:resnet50 --input-shape 3,224,224 \\
      --batch-size 32 --optimizer sgd --json
  coloc-estimate --model mymodels.py:build --model-kwargs '{"width": 512}' \\
      --input-shape 128 --input-dtype int64 --batch-size 16 --optimizer adamw --amp
  coloc-estimate --script train.sh          # spec from the script's #COLOC lines
"""


def _shape(text: str) -> Tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise EstimateError(f"input shape {text!r}: expected comma-separated integers like 3,224,224")
    if not dims or any(d < 1 for d in dims):
        raise EstimateError(f"input shape {text!r}: dimensions must be >= 1")
    return dims


def _fail(exc: ColocError) -> None:
    click.echo(f"coloc-estimate: error: {exc.one_line()}", err=True)
    sys.exit(exc.exit_code)


@click.command(epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "model", default=None, help="package.module:callable or path/to/file.py:callable.")
@click.option("--model-kwargs", default="{}", help="JSON object of keyword arguments for the callable.")
@click.option("--input-shape", default=None, help="Per-sample shape: 3,224,224 or 128,512 or 128 (tokens).")
@click.option("--input-dtype", type=click.Choice(["float32", "int64"]), default="float32",
              help="int64 = token ids (language models).")
@click.option("--batch-size", type=int, default=None, help="Samples per training step.")
@click.option("--optimizer", type=click.Choice(["sgd", "sgd-momentum", "adam", "adamw"]), default="adam")
@click.option("--amp", is_flag=True, help="Autocast fp16 with GradScaler.")
@click.option("--bf16", is_flag=True, help="Autocast bf16 (no GradScaler).")
@click.option("--gpu", "gpu", default=None, help="GPU model (default $COLOC_GPU_MODEL or H100).")
@click.option("--script", type=click.Path(dir_okay=False), default=None,
              help="Job script whose #COLOC lines give the spec (instead of the options above).")
@click.option("--history", "history", type=int, multiple=True,
              help="Measured peak (MiB) of an earlier run of the same spec (repeatable).")
@click.option("--no-cache", is_flag=True,
              help="Trace even if this spec was estimated before (cache: ~/.cache/slurm-coloc/estimates.json).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def main(model: Optional[str], model_kwargs: str, input_shape: Optional[str], input_dtype: str,
         batch_size: Optional[int], optimizer: str, amp: bool, bf16: bool, gpu: Optional[str],
         script: Optional[str], history: Tuple[int, ...], no_cache: bool, as_json: bool) -> None:
    """Estimate the peak per-process GPU memory (MiB, as NVML reports it) of a training job.

    The step assumed: zero_grad, forward, cross-entropy on the logits, backward, optimizer step.
    A repeated estimate of the same spec and model code is read from a per-user cache
    ($XDG_CACHE_HOME/slurm-coloc/estimates.json) without importing torch.
    """
    from slurm_coloc.estimate import estimate_peak
    from slurm_coloc.estimate.spec import ModelSpec

    if no_cache:
        os.environ["COLOC_ESTIMATE_CACHE"] = "off"
    try:
        gpu_name = gpu or os.environ.get("COLOC_GPU_MODEL") or "H100"
        if script:
            spec = _spec_from_script(script)
        else:
            if not model or not input_shape or batch_size is None:
                raise EstimateError("give --model, --input-shape and --batch-size, or --script")
            if amp and bf16:
                raise EstimateError("--amp and --bf16 exclude each other")
            try:
                kwargs: Any = json.loads(model_kwargs)
            except ValueError as exc:
                raise EstimateError(f"--model-kwargs {model_kwargs!r} is not JSON: {exc}")
            if not isinstance(kwargs, dict):
                raise EstimateError(f"--model-kwargs {model_kwargs!r} must be a JSON object")
            spec = ModelSpec(model=model, input_shape=_shape(input_shape), batch_size=batch_size,
                             kwargs=kwargs, input_dtype=input_dtype, optimizer=optimizer,
                             precision="amp-fp16" if amp else ("bf16" if bf16 else "fp32"),
                             base_dir=os.getcwd())
        est = estimate_peak(spec, gpu_name, history)
    except ColocError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(json.dumps({"estimate_mib": est.mem_mib, "method": est.method, "gpu": est.gpu_model,
                               "spec": spec.to_json(), "detail": est.detail}, sort_keys=True))
    else:
        parts = ", ".join(f"{k} {v}" for k, v in est.detail.items())
        click.echo(f"{est.mem_mib} MiB ({est.method}, {est.gpu_model}): {parts}")


def _spec_from_script(path: str) -> Any:
    try:
        from slurm_coloc.submit.directives import parse_script
    except ImportError as exc:  # pragma: no cover - the lead ships directives.py
        raise EstimateError(f"--script needs slurm_coloc.submit.directives: {exc}")
    parsed = parse_script(path)
    if parsed.spec is None:
        raise EstimateError(f"script {path}: no #COLOC model lines (use the options instead)")
    return parsed.spec


if __name__ == "__main__":  # pragma: no cover
    main()
