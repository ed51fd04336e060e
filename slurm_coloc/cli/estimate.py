"""``coloc-estimate``: print the peak GPU memory a training job will hold."""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Optional, Sequence, Tuple

import click

from slurm_coloc.cli import version_option
from slurm_coloc.errors import ColocError, EstimateError, require

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
        raise EstimateError(f"input shape {text!r}: expected comma-separated integers like "
                            "3,224,224") from None
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
@click.option("--gpu", "gpu", default=None,
              help="GPU model (default: the config's, for the partition of the --script's #SBATCH -p).")
@click.option("--script", type=click.Path(dir_okay=False), default=None,
              help="Job script whose #COLOC lines give the spec (instead of the options above).")
@click.option("--history", "history", type=int, multiple=True,
              help="Measured peak (MiB) of an earlier run of the same spec (repeatable).")
@click.option("--no-cache", is_flag=True,
              help="Trace even if this spec was estimated before (cache: "
                   "~/.cache/slurm-coloc/estimates.json).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--no-server", is_flag=True,
              help="Never use or start the warm estimate server (same as COLOC_ESTIMATE_SERVER=0).")
@version_option("coloc-estimate")
def main(model: Optional[str], model_kwargs: str, input_shape: Optional[str], input_dtype: str,
         batch_size: Optional[int], optimizer: str, amp: bool, bf16: bool, gpu: Optional[str],
         script: Optional[str], history: Tuple[int, ...], no_cache: bool, as_json: bool,
         no_server: bool) -> None:
    """Estimate the peak per-process GPU memory (MiB, as NVML reports it) of a training job.

    The step assumed: zero_grad, forward, cross-entropy on the logits, backward, optimizer step.
    A repeated estimate of the same spec and model code is read from a per-user cache
    ($XDG_CACHE_HOME/slurm-coloc/estimates.json) without importing torch. Other estimates go to
    the user's warm estimate server when one runs (torch already imported; started in the
    background by the first such call; docs/user.md), else run in this process.

    \f
    Args:
        model, model_kwargs, input_shape, input_dtype, batch_size, optimizer, amp, bf16, gpu, script,
            history, no_cache, as_json: the options above, as ``run`` takes them (``history`` in MiB).
        no_server: ``--no-server``: never use or start the warm estimate server.

    Raises:
        SystemExit: bad input or torch missing (one error line, the ``ColocError``'s exit code), or the
            server's exit code.
    """
    try:
        gpu = gpu or _config_gpu(script)
    except ColocError as exc:
        _fail(exc)
    params: Dict[str, Any] = dict(
        model=model, model_kwargs=model_kwargs, input_shape=input_shape, input_dtype=input_dtype,
        batch_size=batch_size, optimizer=optimizer, amp=amp, bf16=bf16, gpu=gpu, script=script,
        history=list(history), no_cache=no_cache, as_json=as_json)
    from slurm_coloc.cli import estimate_server as server

    cached = _cache_hit(params)
    if not cached:
        try:
            require("torch")  # one line with the install hint, not a traceback from deep in the estimator
            require("numpy")  # torch does not depend on it; the estimator's tables do
        except ColocError as exc:
            _fail(exc)
    use_server = server.wanted(no_server) and not cached
    if use_server:
        res = server.request(params)
        if res is not None:
            code, out, err = res
            _write(sys.stdout, out)
            _write(sys.stderr, err)
            sys.exit(code)
    try:
        run(**params)
    finally:
        if use_server:
            server.ensure_started("slurm_coloc.cli.estimate")  # for the next call; this one ran in-process


def serve(key: str, path: str) -> None:
    """Entry point of the warm estimate server process (``estimate_server.ensure_started`` spawns it):
    serves :func:`run` requests on the socket ``path`` for the server key ``key``.

    Args:
        key: the server key (hex, ``estimate_server.server_key``).
        path: the unix socket's path (``estimate_server.socket_path``).
    """
    from slurm_coloc.cli import estimate_daemon

    estimate_daemon.serve_main(key, path, run)


def _config_gpu(script: Optional[str]) -> str:
    """The config's GPU model (as coloc-sbatch picks it): that of the partition of ``script``'s ``#SBATCH -p``
    line, else ``gpu_model``. Raises ConfigError (bad config, unknown model name)."""
    from slurm_coloc import config
    from slurm_coloc.submit.directives import parse_script
    from slurm_coloc.submit.request import gpu_models, script_options

    try:
        options = script_options(parse_script(script))[0] if script else []
    except ColocError:
        options = []  # a bad script: the estimate below reports it
    return gpu_models(config.load(), options)[0]


def _write(stream: Any, data: bytes) -> None:
    """Write the server's captured bytes to ``stream`` verbatim (decoded where it has no buffer)."""
    stream.flush()
    buf = getattr(stream, "buffer", None)
    if buf is not None:
        buf.write(data)
        buf.flush()
    elif data:
        stream.write(data.decode(getattr(stream, "encoding", None) or "utf-8", "replace"))
        stream.flush()


def _cache_hit(params: Dict[str, Any]) -> bool:
    """Whether this call needs no server: the per-user cache holds its estimate, or the input is
    bad in a way found without torch (the in-process run reports it). Never raises."""
    from slurm_coloc.estimate import cache

    if params["no_cache"] or not cache.enabled():
        return False
    try:
        from slurm_coloc.estimate.loader import validate_spec
        from slurm_coloc.estimate.spec import gpu_model

        spec = _build_spec(params)
        gpu = gpu_model(params["gpu"] or os.environ.get("COLOC_GPU_MODEL") or "H100")
        validate_spec(spec)
        key = cache.cache_key(spec, gpu.name)
        return key is not None and cache.lookup(key) is not None
    except Exception:  # bad input: the in-process run reports it
        return True


def _build_spec(params: Dict[str, Any]) -> Any:
    """The ModelSpec the options (or ``--script``) describe. Raises EstimateError on bad input."""
    from slurm_coloc.estimate.spec import ModelSpec

    if params["script"]:
        return _spec_from_script(params["script"])
    model, input_shape, batch_size = params["model"], params["input_shape"], params["batch_size"]
    model_kwargs, amp, bf16 = params["model_kwargs"], params["amp"], params["bf16"]
    if not model or not input_shape or batch_size is None:
        raise EstimateError("give --model, --input-shape and --batch-size, or --script")
    if amp and bf16:
        raise EstimateError("--amp and --bf16 exclude each other")
    try:
        kwargs: Any = json.loads(model_kwargs)
    except ValueError as exc:
        raise EstimateError(f"--model-kwargs {model_kwargs!r} is not JSON: {exc}") from None
    if not isinstance(kwargs, dict):
        raise EstimateError(f"--model-kwargs {model_kwargs!r} must be a JSON object")
    return ModelSpec(model=model, input_shape=_shape(input_shape), batch_size=batch_size,
                     kwargs=kwargs, input_dtype=params["input_dtype"], optimizer=params["optimizer"],
                     precision="amp-fp16" if amp else ("bf16" if bf16 else "fp32"),
                     base_dir=os.getcwd())


def run(model: Optional[str], model_kwargs: str, input_shape: Optional[str], input_dtype: str,
        batch_size: Optional[int], optimizer: str, amp: bool, bf16: bool, gpu: Optional[str],
        script: Optional[str], history: Sequence[int], no_cache: bool, as_json: bool) -> None:
    """The estimate itself (what ``main`` runs in-process and the warm server runs per request).

    Prints the estimate (JSON with ``as_json``); on bad input prints one error line and exits 2.

    Args:
        model: ``package.module:callable`` or ``path/to/file.py:callable``, or None with ``script``.
        model_kwargs: the model's keyword arguments as JSON text.
        input_shape: one sample's shape without the batch dimension (``3,224,224``), or None.
        input_dtype: the input's dtype (``float32``, or ``int64`` for token ids).
        batch_size: samples per training step, or None.
        optimizer: ``sgd``, ``sgd-momentum``, ``adam`` or ``adamw``.
        amp, bf16: mixed precision (fp16 autocast) or bf16; neither: fp32.
        gpu: the GPU model (default ``$COLOC_GPU_MODEL``, else ``H100``).
        script: a batch script whose ``#COLOC`` lines give the model, or None.
        history: measured peaks of earlier runs of the same spec (MiB).
        no_cache: do not use the estimate cache; as_json: print one JSON object.

    Raises:
        SystemExit: bad input (exit 2, the ``ColocError``'s exit code), after one error line on stderr.
    """
    from slurm_coloc.estimate import estimate_peak

    params = dict(model=model, model_kwargs=model_kwargs, input_shape=input_shape, input_dtype=input_dtype,
                  batch_size=batch_size, optimizer=optimizer, amp=amp, bf16=bf16, gpu=gpu, script=script)
    if no_cache:
        os.environ["COLOC_ESTIMATE_CACHE"] = "off"
    try:
        gpu_name = gpu or os.environ.get("COLOC_GPU_MODEL") or "H100"
        spec = _build_spec(params)
        est = estimate_peak(spec, gpu_name, tuple(history))
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
    """The ModelSpec of a job script's ``#COLOC`` lines. Raises EstimateError without them."""
    from slurm_coloc.submit.directives import parse_script

    parsed = parse_script(path)
    if parsed.spec is None:
        raise EstimateError(f"script {path}: no #COLOC model lines (use the options instead)")
    return parsed.spec


if __name__ == "__main__":  # pragma: no cover
    main()
