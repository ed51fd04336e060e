"""``coloc-estimate``: print the peak GPU memory a training job will hold; and coloc-sbatch's estimate, run
in a child process so the user's model never touches coloc-sbatch's stdout or time.

``estimate_isolated`` starts ``python -c <bootstrap>`` (this interpreter, this ``sys.path``, the caller's
working directory) in a new session, so it and whatever it forks form one process group. The child
(``child_main``) reads its task from stdin and writes the result as JSON to a private file; its stdout and
stderr go to a private log file (``--parsable`` prints the job id alone). After ``timeout_s`` the group is
killed (SIGKILL) and the caller gets None; it is killed in every case once the child is done.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any, Dict, Optional, Sequence, Tuple

import click

from slurm_coloc.cli import version_option
from slurm_coloc.errors import ColocError, EstimateError, require
from slurm_coloc.estimate.spec import Estimate, ModelSpec

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
            _write(sys.stdout, res.stdout)
            _write(sys.stderr, res.stderr)
            sys.exit(res.exit_code)
    try:
        run(**params)
    finally:
        if use_server:
            server.ensure_started("slurm_coloc.cli.estimate")  # for the next call; this one ran in-process


def serve(key: str, path: str) -> None:
    """The warm estimate server process (``estimate_server.ensure_started`` spawns it): serves :func:`run`
    requests on the socket ``path`` for the server key ``key`` (hex)."""
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


def _write(stream: IO[str], data: bytes) -> None:
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


def _build_spec(params: Dict[str, Any]) -> ModelSpec:
    """The ModelSpec the options (or ``--script``) describe. Raises EstimateError on bad input."""
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
    """The estimate itself (what ``main`` runs in-process and the warm server runs per request): prints it
    (JSON with ``as_json``), or one error line and exit 2 on bad input. ``history``: earlier peaks (MiB);
    ``gpu`` defaults to ``$COLOC_GPU_MODEL``, else ``H100``."""
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


def _spec_from_script(path: str) -> ModelSpec:
    """The ModelSpec of a job script's ``#COLOC`` lines. Raises EstimateError without them."""
    from slurm_coloc.submit.directives import parse_script

    parsed = parse_script(path)
    if parsed.spec is None:
        raise EstimateError(f"script {path}: no #COLOC model lines (use the options instead)")
    return parsed.spec


LOG_TAIL_LINES = 5  # lines of the child's output shown when it died without an answer
_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from slurm_coloc.cli.estimate import child_main; child_main(sys.argv[2])")


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in lines[-LOG_TAIL_LINES:])


def estimate_isolated(spec: ModelSpec, gpu_model: str, history_mib: Sequence[int],
                      timeout_s: float) -> Optional[Estimate]:
    """``estimate.estimate_peak(spec, gpu_model, history_mib)`` (MiB) in a child process group; None when it
    did not answer within ``timeout_s`` (s).

    Raises:
        EstimateError: the estimator's own error (bad spec, a model that cannot be imported or run), or a
            child that died without an answer (the last lines of its output in the message).
    """
    task = {"spec": dataclasses.asdict(spec), "gpu_model": gpu_model,
            "history_mib": [int(h) for h in history_mib]}
    with tempfile.TemporaryDirectory(prefix="coloc-sbatch-est-") as tmp:
        result, log_path = Path(tmp) / "result.json", Path(tmp) / "child.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(sys.path), str(result)],
                                    stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True)
        try:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(json.dumps(task).encode())
                proc.stdin.close()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return None
        finally:
            _kill_group(proc.pid)  # the child's pgid is its pid (new session); also kills what it forked
            proc.wait()
        try:
            answer: Dict[str, Any] = json.loads(result.read_text())
        except (OSError, ValueError):
            raise EstimateError(f"the estimate process died (exit {proc.returncode}) without an answer: "
                                f"{_tail(log_path) or 'no output'}") from None
    if "error" in answer:
        raise EstimateError(str(answer["error"]))
    try:
        return Estimate.from_json(answer)
    except ValueError as exc:
        raise EstimateError(f"the estimate process answered badly: {exc}") from None


def child_main(result_path: str) -> None:
    """The child: read the task from stdin, estimate, write ``Estimate.to_json()`` or ``{"error": <one
    line>}`` to ``result_path`` (whole, by rename), then ``os._exit(0)``. A malformed task on stdin ends it
    without an answer, which the parent reports."""
    task = json.loads(sys.stdin.read())
    spec_fields = dict(task["spec"])
    spec_fields["input_shape"] = tuple(spec_fields["input_shape"])
    answer: Dict[str, Any]
    try:
        from slurm_coloc.estimate import estimate_peak

        try:
            est = estimate_peak(ModelSpec(**spec_fields), task["gpu_model"], history_mib=task["history_mib"])
            answer = est.to_json()
        except ColocError as exc:
            answer = {"error": exc.one_line()}
    except Exception as exc:  # the user's model may raise anything; one line back to the parent
        answer = {"error": " ".join(f"the model failed: {type(exc).__name__}: {exc}".split())[:2000]}
    text = json.dumps(answer, default=str)
    tmp = result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, result_path)  # whole or nothing: a kill mid-write leaves no half answer
    sys.stdout.flush()
    os._exit(0)  # skip the model's atexit handlers and non-daemon threads: the answer is written


if __name__ == "__main__":  # pragma: no cover
    main()
