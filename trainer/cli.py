"""The Hydra entry point behind ``train.py`` and the ``trainer-train`` console script.

It checks the command line against the schema before Hydra composes (so a typo gets a one-paragraph
answer, not a Hydra stack), applies ``scale=``, saves the effective config, runs the job, and
keeps a sweep going when one job fails (its metrics.json says why; the exit code says that
something failed).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Callable, List

from .errors import ConfigError, UserFacingError
from .paths import CONFIG_DIR, RECIPE_DIR
from .rank import global_rank

log = logging.getLogger("trainer")

# Hydra options that take a value as the next argument
_OPTS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"}
_NO_CHECK = {"--help", "-h", "--hydra-help", "--version", "--shell-completion", "-sc", "--info", "-i"}

_failed_jobs: List[str] = []


def recipes() -> List[str]:
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


# Hydra modes that exclude each other ("Only one of --run, --multirun, --cfg, ..." is a ValueError traceback)
_MODES = {"-m": "--multirun", "--multirun": "--multirun", "--cfg": "--cfg", "-c": "--cfg", "--info": "--info", "-i": "--info",
          "--shell-completion": "--shell-completion", "-sc": "--shell-completion"}


def check_modes(argv: List[str]) -> None:
    modes = sorted({_MODES[a] for a in argv if a in _MODES})
    if len(modes) > 1:
        raise ConfigError(
            f"{' and '.join(modes)} cannot be combined: Hydra runs one mode at a time. To see a sweep job's config, "
            "give one job's values with --cfg job (e.g. python train.py amp=true --cfg job); to run the sweep, use -m alone."
        )


def user_overrides(argv: List[str]) -> List[str] | None:
    """The key=value overrides in ``argv`` (Hydra's own options skipped); None for --help and the like."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in _NO_CHECK:
            return None
        if arg in _OPTS_WITH_VALUE:
            skip = True
            continue
        if arg.startswith("-"):  # Hydra's flags (-m, --multirun, ...); overrides never start with "-"
            continue
        out.append(arg)
    return out


def check_output_dirs(overrides: List[str]) -> None:
    """hydra.run.dir / hydra.sweep.dir given on the command line must be creatable and writable."""
    import tempfile

    for ov in overrides:
        key, _, value = ov.partition("=")
        if key.lstrip("+") not in ("hydra.run.dir", "hydra.sweep.dir") or "${" in value or "," in value:
            continue
        try:
            os.makedirs(value, exist_ok=True)
            with tempfile.TemporaryFile(dir=value):
                pass
        except OSError as e:
            raise ConfigError(
                f"'{key}={value}' cannot be used as the output dir: {e.strerror or e} ({type(e).__name__}). "
                "Point it at a writable folder; nothing was written and no earlier result was touched."
            ) from None


def expand_repeats(argv: List[str]) -> List[str]:
    """``repeats=N`` in a sweep becomes ``repeat=range(N)``, placed first so that it varies slowest:
    every configuration runs once, then again, so slow drift of the machine hits all of them alike."""
    found = [a for a in argv if a.split("=", 1)[0] == "repeats"]
    if not found:
        return argv
    value = found[-1].split("=", 1)[1]
    if "," in value or "(" in value:
        raise ConfigError(f"'repeats={value}' takes one integer (how many times each configuration runs), not a sweep.")
    n = int(value)
    if n <= 1:
        return [a for a in argv if a not in found]
    if not any(a in ("-m", "--multirun") for a in argv):
        raise ConfigError(
            f"'repeats={n}' runs each configuration of a sweep {n} times: add -m "
            f"(python train.py -m ... repeats={n}); a single run is one repetition."
        )
    rest = [a for a in argv if a not in found]
    first = next((i for i, a in enumerate(rest) if "=" in a and not a.startswith("-")), len(rest))
    return rest[:first] + [f"repeat=range({n})"] + rest[first:]


def expand_tuned(argv: List[str]) -> List[str]:
    """``+tuned=PATH`` (a best.yaml of python -m trainer.tune) becomes its overrides, in its place.

    Hydra cannot include a file of overrides, and a config group would not reach the processes a
    launcher starts (Slurm jobs compose again from the overrides): plain overrides reach them all,
    and ``.hydra/overrides.yaml`` records what ran."""
    out: List[str] = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "tuned" and not arg.startswith("-"):
            from .tune.output import load_tuned

            out += load_tuned(value)
        else:
            out.append(arg)
    return out


def check_config_files(dirs=None) -> None:
    """Every YAML file of the config tree parses (Hydra would answer a broken one with a yaml traceback)."""
    import yaml

    for directory in dirs or (CONFIG_DIR, RECIPE_DIR):
        for path in sorted(Path(directory).rglob("*.yaml")):
            try:
                yaml.safe_load(path.read_text())
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
                what = " ".join(str(getattr(e, "problem", None) or e).split())
                context = getattr(e, "context", None)
                raise ConfigError(
                    f"{path}{where}: not valid YAML ({(context + ': ') if context else ''}{what}). "
                    "Fix the file (a recipe, or a config you edited); nothing ran."
                ) from None


def checked_argv(argv: List[str], first: Callable[[List[str]], None] | None = None,
                 then: Callable[[List[str]], None] | None = None) -> List[str]:
    """The command line checked before Hydra composes (train.py's and the tuner's), ``+tuned=`` expanded.

    ``first`` sees the raw arguments after the mode check; ``then`` the expanded overrides before
    the shared checks (which create the output dir). Raises ConfigError."""
    check_modes(argv)
    if first:
        first(argv)
    if user_overrides(argv) is None:
        return argv  # --help and the like: Hydra answers
    from .config import check_overrides

    argv = expand_tuned(argv)
    overrides = user_overrides(argv)
    if then:
        then(overrides)
    check_config_files()
    check_overrides(overrides, recipes())
    check_output_dirs(overrides)
    return argv


def fail(message: str, code: int = ConfigError.exit_code) -> None:
    print(f"\nerror: {message}\n", file=sys.stderr)
    sys.exit(code)


def _record_failure(out_dir: str, cfg, overrides: List[str], error: str) -> None:
    """A job that failed before (or outside) ``run`` still leaves a metrics.json, so its report row survives."""
    from . import metrics
    from .run import flags_of

    path = os.path.join(out_dir, "metrics.json")
    if os.path.exists(path) and metrics.read(path).get("status") == "failed":
        return  # run() (or rank 0) already recorded this failure
    record = metrics.build(
        status="failed", error=error, recipe=cfg.get("recipe"), flags=flags_of(cfg), device=None, epochs=[], summary={},
        peak_memory=None, train_loss=None, val_acc=None, extra={"overrides": list(overrides)},
    )
    metrics.write(path, record)


def _log_status(num, overrides: List[str], out_dir: str) -> None:
    """A launched job's status line, from the metrics.json its rank 0 wrote."""
    from . import console, metrics

    try:
        result = metrics.read(os.path.join(out_dir, "metrics.json"))
    except (OSError, ValueError):
        result = {}
    _status(console.status_line(num, overrides, result, out_dir), ok=result.get("status") == "ok")


def _status(line: str, ok: bool) -> None:
    """A sweep job's status line (a warning when the job did not finish)."""
    from . import console

    log.log(logging.INFO if ok else logging.WARNING, line, extra={console.STATUS_LINE: True})


def prepare_hydra() -> None:
    """The schema in Hydra's ConfigStore and the resolvers configs/train.yaml uses."""
    from omegaconf import OmegaConf

    from .config import register_schema

    register_schema()
    rank = str(global_rank())
    OmegaConf.register_new_resolver("trainer_rank_suffix", lambda: "" if rank == "0" else f"_rank{rank}", replace=True)
    OmegaConf.register_new_resolver("trainer_rank0_only", lambda value: value if rank == "0" else None, replace=True)


def task(cfg) -> None:
    """One Hydra job: apply the scale, save the effective config, run, record the outcome."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    from . import console
    from .model_config import replace_retargeted_model
    from .run import run
    from .scale import apply_scale

    from . import stopping, sweep

    hc = HydraConfig.get()
    out_dir = hc.runtime.output_dir
    multirun = hc.mode == RunMode.MULTIRUN
    overrides = list(hc.overrides.task)
    console.set_sweep(multirun)
    num = hc.job.num if multirun else 0  # hydra.job.num exists in sweeps only
    label = console.job_label(num, overrides)
    if not multirun:
        # a single run in this process (also a launched rank); a local sweep's jobs have the sweep's
        # (ABReportCallback.on_multirun_start), and a Slurm job keeps submitit's until fit takes over
        stopping.install()
    elif sweep.running() and stopping.requested():
        raise sweep.SweepStopped(stopping.requested())  # the signal came between two jobs
    action = sweep.resume_action(out_dir) if multirun else "run"
    if multirun and action != "keep":
        sweep.announce(num, overrides)
    if action == "keep":  # finishing a stopped sweep: this job had finished
        _status(console.status_line(num, overrides, sweep.keep_finished(out_dir), out_dir), ok=True)
        return
    try:
        cfg = replace_retargeted_model(apply_scale(cfg, overrides), overrides)
        config_path = os.path.join(out_dir, hc.output_subdir, "config.yaml") if hc.output_subdir is not None else None
        if config_path and global_rank() == 0:
            # Hydra saved the config before scale= was applied; keep the one that actually runs
            # (run() rewrites it again once the batch size, lr and class count are settled).
            OmegaConf.save(cfg, config_path, resolve=True)
        from .launch import inside_launcher, launch, needs_launch
        from .outputs import refuse_finished_run_dir
        from .slurm import resume_if_requeued

        resume_if_requeued(cfg, out_dir)
        if action == "resume":  # finishing a stopped sweep: this job stopped after saving
            with open_dict(cfg):
                cfg.ckpt_path = "last"

        if not inside_launcher():  # a launched rank's dir is its parent's, which checked it
            refuse_finished_run_dir(out_dir, cfg.ckpt_path, "hydra.sweep.dir" if multirun else "hydra.run.dir")
        if needs_launch(cfg):
            # check the config once here, not once per rank
            from . import hardware, switchboard
            from .config import validate

            validate(cfg)
            switchboard.resolve(cfg, hardware.detect(cfg.accelerator))
            # the child processes run this job in this job's dir; (rank 0 of) them writes metrics.json
            code = launch(cfg, out_dir, overrides, quiet=multirun)
            if code != 0:
                _record_failure(out_dir, cfg, overrides, f"its processes exited with status {code}; see the logs in {out_dir}")
                if not multirun:
                    sys.exit(code)
                log.error("%s: its processes exited with status %d; see %s", label, code, out_dir)
                _failed_jobs.append(out_dir)
            elif multirun:
                _log_status(num, overrides, out_dir)
            if multirun and sweep.running() and stopping.requested():
                raise sweep.SweepStopped(stopping.requested())
            return
        result = run(cfg, out_dir, overrides, config_path=config_path)
        from .slurm import leave_for_requeue

        leave_for_requeue(result)
        if multirun:
            _status(console.status_line(num, overrides, result, out_dir), ok=result.get("status") == "ok")
        else:
            log.info("results: %s (TensorBoard: tensorboard --logdir %s)", os.path.join(out_dir, "metrics.json"), out_dir)
        if result.get("preempted"):
            from .checkpointing import PREEMPTED_EXIT_CODE

            if not multirun:
                print(f"\n{result['error']} (exit code {PREEMPTED_EXIT_CODE})", file=sys.stderr)
                sys.exit(PREEMPTED_EXIT_CODE)
            _failed_jobs.append(out_dir)
        if multirun and sweep.running() and stopping.requested():
            # this job saved (or finished): the sweep ends here. Only a sweep whose jobs run in this
            # process: a Slurm job (submitit) returns its result, and its sweep goes on waiting
            raise sweep.SweepStopped(stopping.requested())
    except UserFacingError as e:
        from .outputs import OutputTaken

        if not isinstance(e, OutputTaken):  # an earlier run's results are not ours to overwrite, even with a failure record
            _record_failure(out_dir, cfg, overrides, str(e))
        if not multirun:
            fail(str(e), e.exit_code)
        log.error("%s stopped: %s", label, e)
        _failed_jobs.append(out_dir)
    except Exception:
        if not multirun:
            raise
        log.exception("%s failed; its metrics.json records the error, and the sweep goes on", label)
        _failed_jobs.append(out_dir)


def main() -> None:
    from . import stopping, sweep
    from .console import quiet_known_warnings

    quiet_known_warnings()
    sweep.remember_argv(sys.argv[1:])
    try:
        argv = checked_argv(sys.argv[1:])
        if user_overrides(argv) is not None:
            sys.argv[1:] = expand_repeats(argv)
    except ConfigError as e:
        fail(str(e))

    import hydra

    from .launch import exit_launched_rank, leave_process_group

    prepare_hydra()
    stopping.clear()
    code = None  # how the process is about to end, once it ends by itself or by sys.exit
    try:
        try:
            hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")(task)()
        except (sweep.SweepStopped, stopping.Stopped) as stop:
            if isinstance(stop, stopping.Stopped) and not sweep.running():
                import signal

                print(f"\n{stop}\n", file=sys.stderr)
                sys.exit(128 + int(signal.Signals[stop.signal_name]))
            sys.exit(sweep.finish_stopped(stop.signal_name))
        if _failed_jobs:
            print(f"\n{len(_failed_jobs)} job(s) failed; see metrics.json in: {', '.join(_failed_jobs)}", file=sys.stderr)
            sys.exit(1)
        code = 0
    except SystemExit as e:
        code = e.code
        raise
    finally:
        stopping.uninstall_all()
        leave_process_group()
        if code is not None or sys.exc_info()[0] is SystemExit:
            exit_launched_rank(code)  # a torchrun rank ends here; any other exception on its way is left to Python


if __name__ == "__main__":
    main()
