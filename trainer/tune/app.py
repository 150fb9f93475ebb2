"""The Hydra entry point of ``python -m trainer.tune`` (and the ``trainer-tune`` console script).

It takes the same command line as train.py (composed by Hydra from the same config tree, checked
the same way before composing), runs the search in its own run dir (``tune.log``, the journal,
``probes/`` and ``verify/`` with one run dir per probe, then ``best.yaml`` and the report), and
refuses sweeps and other launchers: probes that share the machine would time each other.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import List

from ..errors import ConfigError, UserFacingError

log = logging.getLogger("trainer.tune")

# written into the tune's run dir by Hydra and by us; anything else there is not a tune's
_OURS = {".hydra", "tune.log", "probes", "verify", "tune_journal.jsonl", "best.yaml", "tune_report.md", "tune_report.csv", "tune_report.png"}


def check_argv(argv: List[str]) -> None:
    if any(a in ("-m", "--multirun") for a in argv):
        raise ConfigError(
            "python -m trainer.tune runs its probes one after another on this machine; it takes no -m. "
            "Give one configuration (e.g. python -m trainer.tune +recipe=resnet50 scale=smoke); the tuner varies the flags itself."
        )
    launcher = [a for a in argv if a.lstrip("+").startswith("hydra/launcher=")]
    if launcher:
        raise ConfigError(
            f"'{launcher[0]}': the tuner refuses other launchers. Its probes are timed and must not share the machine "
            "(a parallel launcher would run them side by side). Run the tune on the machine (or inside the Slurm job) you want tuned."
        )
    bare = [a for a in argv if a.startswith("tune.extra.")]
    if bare:
        raise ConfigError(
            f"'{bare[0]}': a candidate of your own is a new key, so it takes a leading + "
            f"(+{bare[0].split('=', 1)[0]}=\"k=v k2=v2\", quoted for Hydra and the shell: '+tune.extra.narrow=\"model.width=4\"')."
        )
    swept = [a for a in argv if "=" in a and not a.startswith("-") and not a.startswith("hydra.") and ("," in a.split("=", 1)[1] and "[" not in a and "'" not in a)]
    if swept:
        raise ConfigError(f"'{swept[0]}' lists several values: the tuner starts from one configuration and picks the values itself. Give one value.")


def user_run_overrides(task_overrides: List[str]) -> List[str]:
    """The command line's overrides that describe the run (not where the tune writes, not tune.*)."""
    return [o for o in task_overrides if not o.lstrip("+~").startswith(("tune.", "hydra."))]


def tune_task(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from .. import hardware
    from ..config import FLAG_KEYS, validate
    from ..model_config import replace_retargeted_model
    from ..scale import apply_scale
    from .candidates import CATALOGUE, NAMES, Context, allocators_installed, extra_candidates
    from .output import machine_name, write_best, write_report
    from .probe import JOURNAL, Journal, Prober
    from .search import Search

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    user = user_run_overrides(list(hc.overrides.task))
    try:
        cfg = replace_retargeted_model(apply_scale(cfg, list(hc.overrides.task)), list(hc.overrides.task))
        validate(cfg)
        tune = cfg.tune
        for key, low in (("budget_min", 0), ("probe_batches", 1), ("probe_epochs", 3), ("horizon_epochs", 1), ("verify_epochs", 1)):
            if tune[key] is None or tune[key] < low or (low == 0 and tune[key] <= 0):
                raise ConfigError(f"Bad value for 'tune.{key}': {tune[key]!r}. It must be {'above 0' if low == 0 else f'at least {low}'}"
                                  + (" (one warm-up epoch and at least two measured ones, to judge the noise)" if key == "probe_epochs" else "") + ".")
        if tune.acc_tolerance is None or tune.acc_tolerance < 0:
            raise ConfigError(f"Bad value for 'tune.acc_tolerance': {tune.acc_tolerance!r}. It must be 0 or more (a val_acc difference, e.g. 0.02).")
        unknown = [n for n in (tune.only or []) if n not in NAMES and n not in (tune.extra or {})]
        if unknown:
            raise ConfigError(f"'tune.only' names {', '.join(unknown)}, which is not a candidate. Candidates: {', '.join(NAMES)} (and your tune.extra names).")
        clash = [n for n in (tune.extra or {}) if n in NAMES]
        if clash:
            raise ConfigError(f"'tune.extra.{clash[0]}' has the name of a built-in candidate; give your candidate another name.")
        foreign = [p.name for p in run_dir.iterdir() if p.name not in _OURS]
        if foreign and not (run_dir / JOURNAL).exists():
            raise ConfigError(
                f"hydra.run.dir={run_dir} holds files that are not a tune's ({', '.join(sorted(foreign)[:3])}); a tune writes only into "
                "a new dir or resumes its own. Point hydra.run.dir elsewhere; nothing was changed."
            )
        hw = hardware.detect(cfg.accelerator)
        ctx = Context(
            cuda=hw.accelerator == "cuda",
            bf16_native=hw.bf16_native,
            capability=float(hw.capability or 0),
            cores=hw.cpu_cores,
            data_name=str(cfg.data.name),
            data_root=cfg.data.root,
            allocators=allocators_installed(),
        )
        candidates = list(CATALOGUE) + extra_candidates(OmegaConf.to_container(tune.extra) if tune.extra else {})
        if tune.only:
            candidates = [c for c in candidates if c.name in set(tune.only)]
        base_settings = {k: OmegaConf.select(cfg, k) for k in FLAG_KEYS}
        base_settings.update({"data.pin_memory": cfg.data.pin_memory, "data.prefetch_factor": cfg.data.prefetch_factor,
                              "data.persistent_workers": cfg.data.persistent_workers})
        journal = Journal(run_dir, user)
        prober = Prober(run_dir, user, tune, journal)
        machine = machine_name(hw)
        started = time.time()
        log.info("tuning on %s: %s (budget %g min; journal %s)", machine, " ".join(user) or "(the base config)", tune.budget_min, run_dir / JOURNAL)
        if journal.records:
            log.info("resuming: %d finished probes in the journal are not run again", len(journal.records))
        search = Search(prober.run, candidates, ctx, base_settings, tune, lambda: prober.spent_s)
        outcome = search.run()
        best = write_best(run_dir, user, outcome, machine)
        paths = write_report(run_dir, user, outcome, machine, tune, prober.spent_s)
        log.info("%s", outcome.verdict)
        log.info("best.yaml: %s", best)
        for line in best.read_text().splitlines():
            log.info("  %s", line)
        log.info("report: %s (also %s, %s); took %.1f min", *paths, (time.time() - started) / 60)
    except UserFacingError as e:
        from ..cli import fail

        fail(str(e), e.exit_code)
    except RuntimeError as e:
        from ..cli import fail

        fail(f"{e}. Fix the configuration until python train.py with the same overrides trains; the tuner starts from it.", 1)


def main() -> None:
    from ..cli import check_config_files, check_modes, expand_tuned, fail, prepare_hydra, recipes, user_overrides
    from ..console import quiet_known_warnings
    from ..paths import CONFIG_DIR

    quiet_known_warnings()
    argv = sys.argv[1:]
    overrides = user_overrides(argv)
    try:
        check_modes(argv)
        check_argv(argv)
        if overrides is not None:
            from ..cli import check_output_dirs
            from ..config import check_overrides

            argv = expand_tuned(argv)
            check_config_files()
            check_overrides(user_overrides(argv), recipes())
            check_output_dirs(user_overrides(argv))
    except ConfigError as e:
        fail(str(e))
    # the tune's log file is tune.log, and its run dir is a tune's (not a training run's)
    sys.argv[1:] = argv + ["hydra.job.name=tune"]
    import hydra

    prepare_hydra()
    hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")(tune_task)()


if __name__ == "__main__":
    main()
