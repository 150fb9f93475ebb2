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
from typing import List, Optional

from trainer import config
from trainer.command_line import checked_argv, fail, recipes
from trainer.config import FLAG_KEYS, check_overrides
from trainer.config.compose import finish, prepare_hydra
from trainer.console import quiet_known_warnings
from trainer.errors import ConfigError, UserFacingError
from trainer.launch.run_dirs import forget_earlier_config, keep_config_files, restore_earlier_config
from trainer.measure import hardware
from trainer.paths import CONFIG_DIR
from trainer.tune.probe import JOURNAL, Journal, Prober, check_header

log = logging.getLogger("trainer.tune")


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
            f'(+{bare[0].split("=", 1)[0]}="k=v k2=v2", quoted for Hydra and the shell: \'+tune.extra.narrow="model.width=4"\').'
        )
    resume = [a for a in argv if a.split("=", 1)[0].lstrip("+") == "ckpt_path"]
    if resume:
        raise ConfigError(
            f"'{resume[0]}': the tuner's probes each train a few epochs from scratch, so they cannot start from a checkpoint. "
            "Tune without ckpt_path (the speed of a configuration does not depend on the weights), then resume your run with +tuned=best.yaml."
        )
    swept = [
        a
        for a in argv
        if "=" in a
        and not a.startswith("-")
        and not a.startswith("hydra.")
        and ("," in a.split("=", 1)[1] and not any(q in a for q in "[\"'"))
        or "range(" in a
        or "choice(" in a
    ]
    if swept:
        raise ConfigError(
            f"'{swept[0]}' lists several values: the tuner starts from one configuration and picks the values itself. Give one value."
        )


def check_run_dir(overrides: List[str]) -> None:
    """Before Hydra writes .hydra/ and tune.log there: the run dir is new, empty, or a tune's own."""
    given = [a.split("=", 1)[1] for a in overrides if a.split("=", 1)[0] == "hydra.run.dir" and "${" not in a]
    if not given:
        return  # Hydra's default: a new dir named by the time
    run_dir = Path(given[-1]).expanduser()
    if not run_dir.is_dir():
        return
    if (
        run_dir / JOURNAL
    ).exists():  # a tune's: it resumes with the same overrides (the journal checks the settings too)
        first = (run_dir / JOURNAL).read_text().split("\n", 1)[0]
        problem = check_header(first, {"overrides": user_run_overrides(overrides), "settings": None}, run_dir)
        if problem:
            raise ConfigError(problem + " Nothing was changed.")
        # Hydra rewrites them before the journal's settings are checked (tune_task): put back if refused there
        keep_config_files(str(run_dir), _output_subdir(overrides))
        return
    foreign = sorted(p.name for p in run_dir.iterdir() if p.name not in (".hydra", "tune.log"))
    if foreign:
        raise ConfigError(
            f"hydra.run.dir={given[-1]} holds files that are not a tune's ({', '.join(foreign[:3])}); a tune writes only into a new "
            "dir or resumes its own. Point hydra.run.dir elsewhere; nothing was changed."
        )


def _output_subdir(overrides: List[str]) -> Optional[str]:
    """Where Hydra writes the run's config files: ``hydra.output_subdir`` (``.hydra``; null: nowhere)."""
    given = [a.split("=", 1)[1] for a in overrides if a.split("=", 1)[0] == "hydra.output_subdir"]
    subdir = given[-1] if given else ".hydra"
    return None if subdir in ("null", "None", "") else subdir


def user_run_overrides(task_overrides: List[str]) -> List[str]:
    """The command line's overrides that describe the run (not where the tune writes, not tune.*)."""
    return [o for o in task_overrides if not o.lstrip("+~").startswith(("tune.", "hydra."))]


def own_candidates(tune) -> list:
    """``tune.only`` and ``tune.extra`` checked (a typo is said now, not after a failed probe); the user's own candidates."""
    from omegaconf import OmegaConf  # lazy: keeps omegaconf out of python -m trainer.tune's start-up

    # lazy: no torch before a job starts (trainer/__init__.py)
    from trainer.tune.candidates import NAMES, extra_candidates

    unknown = [n for n in (tune.only or []) if n not in NAMES and n not in (tune.extra or {})]
    if unknown:
        raise ConfigError(
            f"'tune.only' names {', '.join(unknown)}, which is not a candidate. Candidates: {', '.join(NAMES)} (and your tune.extra names)."
        )
    clash = [n for n in (tune.extra or {}) if n in NAMES]
    if clash:
        raise ConfigError(
            f"'tune.extra.{clash[0]}' has the name of a built-in candidate; give your candidate another name."
        )
    extras = extra_candidates(OmegaConf.to_container(tune.extra) if tune.extra else {})
    for cand in extras:  # a typo in a candidate of your own is said now, not after a failed probe
        if not cand.overrides or not all("=" in o for o in cand.overrides):
            raise ConfigError(
                f"'tune.extra.{cand.name}' must hold key=value overrides separated by spaces, e.g. +tune.extra.narrow=\"model.width=4\"."
            )
        try:
            check_overrides(list(cand.overrides), recipes())
        except ConfigError as e:
            raise ConfigError(f"'tune.extra.{cand.name}': {e}") from None
    return extras


def base_settings(cfg) -> dict:
    """The starting configuration's flags and loader settings: what the candidates' conditions read."""
    from omegaconf import OmegaConf  # lazy: keeps omegaconf out of python -m trainer.tune's start-up

    settings = {k: OmegaConf.select(cfg, k) for k in FLAG_KEYS}
    for key in ("pin_memory", "prefetch_factor", "persistent_workers"):
        settings[f"data.{key}"] = cfg.data[key]
    return settings


def target_spec(cfg) -> tuple:
    """tune.objective=time_to_target's target: the report's (report.target_acc, report.target_tolerance)."""
    return cfg.report.target_acc, cfg.report.target_tolerance


def journal_settings(cfg) -> dict:
    """What the journal's measurements depend on besides the overrides: a resumed tune must match them."""
    settings = {k: cfg.tune[k] for k in ("probe_batches", "probe_epochs", "verify_epochs")}
    if cfg.tune.objective == "time_to_target":  # (absent for epoch_time: journals written before it resume)
        if cfg.report.target_acc == "off":
            raise ConfigError(
                "tune.objective=time_to_target judges by the time to report.target_acc, which is off. "
                "Give report.target_acc=auto (the baseline's best val_acc minus report.target_tolerance) or a number."
            )
        settings.update(
            objective="time_to_target",
            target_acc=cfg.report.target_acc,
            target_tolerance=cfg.report.target_tolerance,
            # a probe's time to target counts its first epoch's setup_s (the compiler's warm-up, the first
            # workers' start) since this mark: a journal from before it measured without, so it does not resume
            time_to_target="with setup",
        )
    return settings


def tune_task(cfg) -> None:
    # lazy: keeps hydra and the search's modules out of python -m trainer.tune's start-up (--help, a refusal)
    from hydra.core.hydra_config import HydraConfig

    from trainer.tune.candidates import CATALOGUE, Context
    from trainer.tune.output import machine_name, write_best, write_report
    from trainer.tune.search import Search

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    user = user_run_overrides(list(hc.overrides.task))
    try:
        cfg = finish(cfg, hc.overrides.task)
        config.validate(cfg)  # through the module: a test counts the calls
        tune = cfg.tune  # its ranges are checked by validate, from the schema (config.TuneConfig)
        extras = own_candidates(tune)
        hw = hardware.detect(cfg.accelerator)
        ctx = Context.of(hw, cfg)
        candidates = [c for c in list(CATALOGUE) + extras if not tune.only or c.name in set(tune.only)]
        journal = Journal(run_dir, user, journal_settings(cfg))
        forget_earlier_config(str(run_dir))  # the tune resumes: its config files are this command's
        prober = Prober(run_dir, user, tune, journal)
        machine = machine_name(hw)
        started = time.time()
        log.info(
            "tuning on %s: %s (budget %g min; journal %s)",
            machine,
            " ".join(user) or "(the base config)",
            tune.budget_min,
            run_dir / JOURNAL,
        )
        if journal.records:
            log.info("resuming: %d finished probes in the journal are not run again", len(journal.records))
        outcome = Search(
            prober.run, candidates, ctx, base_settings(cfg), tune, lambda: prober.spent_s, target_spec=target_spec(cfg)
        ).run()
        best = write_best(run_dir, user, outcome, machine)
        paths = write_report(run_dir, user, outcome, machine, tune, prober.spent_s)
        log.info("%s", outcome.verdict)
        log.info("best.yaml: %s", best)
        for line in best.read_text().splitlines():
            log.info("  %s", line)
        log.info("report: %s; took %.1f min", ", ".join(map(str, paths)), (time.time() - started) / 60)
    except UserFacingError as e:
        restore_earlier_config(str(run_dir))  # a resume refused before it probed: the tune's own config files back
        fail(str(e), e.exit_code)
    except RuntimeError as e:
        fail(
            f"{e}. Fix the configuration until python train.py with the same overrides trains; the tuner starts from it.",
            1,
        )
    except KeyboardInterrupt:
        fail(
            f"interrupted. Finished probes are in {run_dir / 'tune_journal.jsonl'}: the same command with hydra.run.dir={run_dir} resumes.",
            130,
        )


def main() -> None:
    quiet_known_warnings()
    try:
        argv = checked_argv(sys.argv[1:], first=check_argv, then=check_run_dir)
    except ConfigError as e:
        fail(str(e))
    # the tune's log file is tune.log, and its run dir is a tune's (not a training run's)
    sys.argv[1:] = argv + ["hydra.job.name=tune"]
    import hydra  # lazy: keeps hydra out of python -m trainer.tune's start-up

    prepare_hydra()
    hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")(tune_task)()


if __name__ == "__main__":
    main()
