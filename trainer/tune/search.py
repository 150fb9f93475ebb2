"""The tuner's search: guided by the doctor, kept only on evidence, checked for accuracy at the end.

1. The baseline (the configuration as given) trains ``tune.verify_epochs`` full epochs: its val_acc
   is the accuracy to keep, and its epoch length is what probe times are scaled to.
2. The baseline is probed; its verdict (input pipeline, transfer, compute, memory) picks the group
   of candidates tried first. Each candidate is probed on top of the incumbent (every flag kept so
   far, so kept flags are always measured together). A candidate is kept only when the bootstrap
   interval of its speed-up over the incumbent lies above 1.0, and again after the incumbent is
   measured once more right after it (a slow drift of the machine cannot make a flag look good).
   After a keep, the new incumbent's verdict picks the next group.
3. When every candidate has been tried, those dropped before a later keep are tried once more on
   top of it (channels_last may pay only with amp on). The budget stops the search between probes.
4. Accuracy guard: the fastest configuration on the path trains the baseline's schedule; it must
   reach the baseline's val_acc within ``tune.acc_tolerance``, else the one before it is checked.
5. The winner and the baseline are probed once more, back to back, and the speed-up reported is
   over both measurements of each (drift between the start and the end of a tune counts).

Compile time is reported apart and spread over ``tune.horizon_epochs`` full epochs.

``tune.objective=time_to_target`` judges by how soon a configuration reaches a target val_acc
(``report.target_acc``: a number, or ``auto``, the baseline's best minus ``report.target_tolerance``)
instead of by epoch time: the baseline's training (validated every epoch) gives the target and its
own time to it, and each probe trains the same schedule until it reaches the target (stop_at_acc),
or to the end, where it is dropped as not reaching it. Reaching the target is the accuracy guard, so
step 4 is not needed; the search, the second look and the final measurement are the same. The tuner
says at the start when the budget cannot hold the probes this needs.

why longer: the search is one loop (probe, keep or drop, second look, accuracy check, final
measurement) over one state (``_Walk``); its steps read best as one module.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from trainer.errors import ConfigError
from trainer.measure.time_to_target import resolve_target, to_target_interval
from trainer.report.noise import speedup_interval
from trainer.report.rows import SEEDED_REPEATS
from trainer.tune.candidates import EPOCHS, EXTRA, ORDER, Candidate, Context, settings_of
from trainer.tune.result import Result

log = logging.getLogger("trainer.tune")


@dataclass
class Step:
    """One row of the tune report."""

    n: int
    candidate: str
    group: str
    chosen_by: str  # the incumbent's verdict when this was tried
    config: List[str]  # the configuration probed (overrides on top of the user's)
    decision: str  # baseline | kept | dropped | failed | skipped | verified | rejected | final
    why: str
    epoch_time_s: Optional[float] = None
    compile_s: Optional[float] = None
    speedup: Optional[float] = None  # vs the incumbent it was tried on
    speedup_ci: Optional[tuple] = None
    vs_baseline: Optional[float] = None
    val_acc: Optional[float] = None
    dir: Optional[str] = None
    time_to_target_s: Optional[float] = None  # tune.objective=time_to_target
    epochs_to_target: Optional[float] = None


@dataclass
class Outcome:
    winner: List[str]
    speedup: Optional[float]
    speedup_ci: Optional[tuple]
    base_acc: Optional[float]
    winner_acc: Optional[float]
    compile_s: float
    base_epoch_s: Optional[float]
    winner_epoch_s: Optional[float]
    steps: List[Step] = field(default_factory=list)
    path: List[List[str]] = field(default_factory=list)
    verdict: str = ""
    budget_hit: bool = False
    unconfirmed: Optional[tuple] = None  # (speedup, interval, why) of a winner the final measurement did not confirm
    objective: str = "epoch_time"
    target: Optional[float] = None  # time_to_target: the val_acc to reach, and how it was chosen
    target_how: str = ""


@dataclass
class _Walk:
    """The greedy search's state: the incumbent (the configuration kept so far) and how it got there."""

    incumbent: List[Result]  # the incumbent's measurements (the baseline's probe at first)
    config: List[str] = field(default_factory=list)  # its overrides on top of the user's
    kept: List[str] = field(default_factory=list)  # the candidates kept, in order
    path: List[List[str]] = field(default_factory=lambda: [[]])  # every configuration kept, from the baseline's
    tried: Dict[str, int] = field(default_factory=dict)  # name -> len(kept) when tried (to retry after later keeps)
    dropped: List[str] = field(default_factory=list)
    budget_hit: bool = False

    def verdict(self) -> str:
        """The incumbent's newest measured verdict ("unknown": no whole epoch timed, nothing measured)."""
        measured = (r.bottleneck for r in reversed(self.incumbent) if r.ok and r.bottleneck not in (None, "unknown"))
        return next(measured, None) or "compute"

    def keep(self, name: str, config: List[str], result: Result) -> None:
        self.config, self.incumbent = config, [result]
        self.kept.append(name)
        self.path.append(list(config))


def merge(config: List[str], overrides: tuple) -> List[str]:
    """``config`` with ``overrides`` applied: a key set again replaces its earlier value."""
    by_key = {ov.partition("=")[0]: ov for ov in config}
    for ov in overrides:
        by_key[ov.partition("=")[0]] = ov
    return list(by_key.values())


def _unmeasured_again(again: Result, target: Optional[float], who: str) -> str:
    """What the final row says where a second measurement does not count (the verdict pools both)."""
    if not again.ok:
        return f"; {who}'s second measurement failed ({again.error}): its first alone counts"
    if target is not None and again.to_target(target) is None:
        return f"; {who} measured again did not reach val_acc {target:.3f}: its first measurement alone counts"
    return ""


def _fmt_ci(ci: Optional[tuple]) -> str:
    return f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else ""


class Search:
    def __init__(
        self,
        probe: Callable[[str, str, List[str]], Result],
        candidates: List[Candidate],
        ctx: Context,
        base_settings: Dict[str, Any],
        tune_cfg: Any,
        spent_s: Callable[[], float],
        target_spec: tuple = ("auto", 0.01),  # report.target_acc, report.target_tolerance (time_to_target)
    ) -> None:
        self.probe = probe
        self.candidates = candidates
        self.by_name = {c.name: c for c in candidates}
        self.ctx = ctx
        self.base_settings = base_settings
        self.cfg = tune_cfg
        self.spent_s = spent_s
        self.steps: List[Step] = []
        self.full_samples = 1.0
        self.kept_results: Dict[str, Result] = {}  # the probe that kept each configuration on the path
        self.objective = getattr(tune_cfg, "objective", "epoch_time")
        self.target_spec = target_spec
        self.target: Optional[float] = None  # set from the baseline's training (time_to_target)
        self.target_how = ""

    # -- measurement -------------------------------------------------------------------------
    def _times(self, results: List[Result]) -> List[List[float]]:
        return [r.epoch_times(self.full_samples, self.cfg.horizon_epochs) for r in results if r.ok]

    def _to_target(self, results: List[Result]) -> List[tuple]:
        """(epoch times up to the target, steady epoch times, the share of its last epoch trained by then) of
        each result that reached it (the share is below 1 with report.val_per_epoch)."""
        found = []
        for r in results:
            reached = r.reach(self.target) if r.ok else None
            if reached:
                times, epochs = reached
                found.append((times, [record[0] for record in r.steady], epochs - (len(times) - 1)))
        return found

    def _compare(self, base: List[Result], other: List[Result]) -> tuple:
        """(speedup of ``other`` over ``base``, its interval) from pooled full-epoch times, or from the
        times to the target (time_to_target: None when ``other`` did not reach it)."""
        if self.target is not None:
            b, o = self._to_target(base), self._to_target(other)
            if not b or not o:
                return None, None
            speed = statistics.median(sum(r[0]) for r in b) / statistics.median(sum(r[0]) for r in o)
            return speed, to_target_interval(b, o)
        b, o = self._times(base), self._times(other)
        if not b or not o:
            return None, None
        speed = statistics.median([t for r in b for t in r]) / statistics.median([t for r in o for t in r])
        return speed, speedup_interval(b, o)

    def _epoch_s(self, results: List[Result]) -> Optional[float]:
        if self.target is not None:  # full epochs as trained (a compile is in the warm-up's time to target)
            times = [record[0] for r in results if r.ok for record in r.steady]
        else:
            times = [t for r in self._times(results) for t in r]
        return statistics.median(times) if times else None

    def _step(self, n: int, name: str, group: str, chosen_by: str, config: List[str], result: Result) -> Step:
        """A probe's row, before its decision."""
        step = Step(
            n, name, group, chosen_by, config, "", "", self._epoch_s([result]), result.compile_s, dir=result.dir
        )
        if self.target is not None and result.ok:
            times, step.epochs_to_target = result.reach(self.target) or (None, None)
            step.time_to_target_s = sum(times) if times else None
            step.val_acc = result.val_acc
        return step

    def _measure(self, name: str, config: List[str]) -> Result:
        """One probe of ``config`` for the objective: a short timed run, or a run to the target."""
        if self.target is None:
            return self.probe("probe", name, config)
        return self.probe("target", name, config, (f"stop_at_acc={self.target}",))

    def _set_target(self, base_verify: Result) -> None:
        """time_to_target: the target from the baseline's training, which must reach it, and a budget
        that holds a judgement (a candidate and the incumbent measured again), else say so now."""
        # each epoch's val_acc, its last validation's, as the report's auto target reads metrics.json
        curve = [{"epoch": n, "val_acc": p[1]} for n, p in enumerate(base_verify.curve) if len(p) < 4 or p[3] >= 1.0]
        target, how = resolve_target(self.target_spec[0], [curve], self.target_spec[1])
        epochs = self.cfg.verify_epochs
        if target is None:
            raise ConfigError(
                f"tune.objective=time_to_target needs a target val_acc, and there is none: {how}. Give report.target_acc "
                "a number or auto, and a configuration that validates (data.val_samples, trainer.limit_val_batches)."
            )
        if target <= 0:
            raise ConfigError(
                f"tune.objective=time_to_target: the target val_acc {target:.3f} ({how}) is reached before any training, "
                "so it cannot tell configurations apart. Give report.target_acc a number in (0, 1], or a "
                "report.target_tolerance below the configuration's best val_acc."
            )
        if base_verify.to_target(target) is None:
            raise ConfigError(
                f"tune.objective=time_to_target cannot judge anything on this schedule: the configuration as given does not reach "
                f"val_acc {target:.3f} ({how}) in tune.verify_epochs={epochs} epochs (val_acc {_acc(base_verify.val_acc)} at the "
                f"end; its training: {base_verify.dir}). Raise tune.verify_epochs or lower report.target_acc, with a new "
                "hydra.run.dir (the journal's measurements hold for this schedule and target only)."
            )
        per_probe = base_verify.wall_s
        needed = self.spent_s() + 2 * per_probe
        if needed > 60.0 * self.cfg.budget_min:
            raise ConfigError(
                f"tune.objective=time_to_target cannot judge a candidate within tune.budget_min={self.cfg.budget_min:g}: each "
                f"probe trains until val_acc {target:.3f} ({how}), up to tune.verify_epochs={epochs} epochs, about "
                f"{per_probe:.0f} s here (the baseline reached it in {base_verify.epochs_to_target(target):g} epochs), and one "
                f"judgement takes two (the candidate, then the configuration it is tried on, again). Give tune.budget_min="
                f"{needed / 60 + 0.05:.1f} or more: the same command with that budget and the same hydra.run.dir resumes "
                "without training the baseline again."
            )
        self.target, self.target_how = target, how
        log.info(
            "objective: time to %s; the configuration as given reaches it in %g epochs",
            how,
            base_verify.epochs_to_target(target),
        )

    def _settings(self, config: List[str]) -> Dict[str, Any]:
        return {**self.base_settings, **settings_of(config)}

    def _budget_left(self) -> bool:
        return self.spent_s() < 60.0 * self.cfg.budget_min

    def _add(self, step: Step) -> Step:
        self.steps.append(step)
        return step

    # -- the search ----------------------------------------------------------------------------
    def _eligible(self, cand: Candidate, config: List[str], kept: List[str]) -> Optional[str]:
        """None if ``cand`` can be tried on ``config`` now, else why not."""
        settings = self._settings(config)
        if self._holds(cand, settings):
            return "already set in the configuration"
        missing = [
            n
            for n in cand.needs
            if n not in kept and not (n in self.by_name and self._holds(self.by_name[n], settings))
        ]
        if missing:
            return f"needs {', '.join(missing)} kept first"
        return cand.skip(self.ctx, settings)

    @staticmethod
    def _holds(cand: Candidate, settings: Dict[str, Any]) -> bool:
        return all(settings.get(k) == v for k, v in settings_of(list(cand.overrides)).items())

    def _next(self, verdict: str, config: List[str], kept: List[str], tried: set) -> Optional[Candidate]:
        groups = ORDER.get(verdict, ORDER["compute"]) + [EPOCHS, EXTRA]
        for group in groups:
            for cand in self.candidates:
                if cand.group == group and cand.name not in tried and self._eligible(cand, config, kept) is None:
                    return cand
        return None

    def run(self) -> Outcome:
        """The baseline, the greedy search from it, a row for each candidate never tried, then the guard."""
        base_verify, base = self._baselines()
        walk = _Walk(incumbent=[base])
        while True:
            if not self._budget_left():
                walk.budget_hit = True
                break
            verdict = walk.verdict()
            cand = self._choose(verdict, walk)
            if cand is None:
                break
            self._try(cand, verdict, walk, base)
        self._add_untried(walk)
        return self._guard(base, base_verify, walk.path, walk.budget_hit)

    def _baselines(self) -> tuple:
        """(the baseline's training, its probe); under time_to_target its training is both, and sets the target."""
        base_verify = self.probe("verify", "baseline", [])
        if not base_verify.ok:
            raise RuntimeError(
                f"the configuration as given does not train: {base_verify.error} (see {base_verify.dir})"
            )
        self.full_samples = float(base_verify.epoch_samples or 1.0)
        log.info(
            "baseline: val_acc %s after %d epochs of %d samples",
            _acc(base_verify.val_acc),
            self.cfg.verify_epochs,
            self.full_samples,
        )
        if self.objective == "time_to_target":
            self._set_target(base_verify)
            base = base_verify  # its training, validated every epoch, is its time to the target
        else:
            base = self.probe("probe", "baseline", [])
        if not base.ok:
            raise RuntimeError(f"the baseline probe failed: {base.error} (see {base.dir})")
        first = self._add(self._step(0, "baseline", "", "", [], base))
        first.decision, first.why = "baseline", "the configuration as given"
        log.info("probe 0 baseline: %.3f s/epoch; %s", self._epoch_s([base]) or 0.0, base.verdict or "no verdict")
        return base_verify, base

    def _choose(self, verdict: str, walk: "_Walk") -> Optional[Candidate]:
        """The next candidate for the incumbent's verdict; when all were tried, once more one dropped before a
        later keep (channels_last may pay only with amp on); None when nothing is left."""
        cand = self._next(verdict, walk.config, walk.kept, set(walk.tried))
        if cand is None:
            retry = [name for name in walk.dropped if walk.tried[name] < len(walk.kept)]
            cand = self._next(verdict, walk.config, walk.kept, set(walk.tried) - set(retry))
            if cand is None:
                return None
            walk.dropped.remove(cand.name)
        walk.tried[cand.name] = len(walk.kept)
        return cand

    def _try(self, cand: Candidate, verdict: str, walk: "_Walk", base: Result) -> None:
        """Probe ``cand`` on the incumbent: dropped unless its interval lies above 1.0, then kept only if
        that holds again with the incumbent measured once more right after it."""
        trial = merge(walk.config, cand.overrides)
        n = len(self.steps)
        result = self._measure(cand.name, trial)
        step = self._add(self._step(n, cand.name, cand.group, verdict, trial, result))
        if not result.ok:
            step.decision, step.why = "failed", f"the probe failed: {result.error}"
            log.info("probe %d %s: failed (%s)", n, " ".join(cand.overrides), result.error)
            return
        speed, ci = self._compare(walk.incumbent, [result])
        step.speedup, step.speedup_ci = speed, ci
        step.vs_baseline = self._compare([base], [result])[0]
        # a time to target measured once may have no interval yet: the incumbent measured again gives one
        promising = ci[0] > 1.0 if ci else (self.target is not None and (speed or 0.0) > 1.0)
        if not promising:
            step.decision = "dropped"
            step.why = self._why_dropped(result, ci)
            walk.dropped.append(cand.name)
        else:
            self._second_look(cand, trial, result, step, walk)
        log.info(
            "probe %d [%s] %s: %.3f s/epoch, %.2fx%s -> %s [%.1f of %g min]",
            n,
            cand.group,
            " ".join(cand.overrides),
            step.epoch_time_s or 0.0,
            step.speedup or 0.0,
            _fmt_ci(step.speedup_ci),
            step.decision,
            self.spent_s() / 60,
            self.cfg.budget_min,
        )

    def _second_look(self, cand: Candidate, trial: List[str], result: Result, step: Step, walk: "_Walk") -> None:
        """The incumbent measured again right after a promising candidate (a drift of the machine cannot fake
        a speed-up): kept when the interval over both of the incumbent's measurements still lies above 1.0."""
        again = self._measure("incumbent-again", walk.config)
        # time_to_target: an incumbent that misses the target measured again confirms nothing
        # (its time would be left out of the comparison, which then rests on the first alone)
        again_missed = again.ok and self.target is not None and again.to_target(self.target) is None
        counted = again.ok and not again_missed
        speed, ci = step.speedup, step.speedup_ci
        if counted:
            walk.incumbent.append(again)
            speed, ci = self._compare(walk.incumbent, [result])
            step.speedup, step.speedup_ci = speed, ci
        if counted and ci is not None and ci[0] > 1.0:
            step.decision, step.why = "kept", f"{speed:.2f}x{self._unit()} over the incumbent, measured twice"
            self.kept_results[_key(trial)] = result
            walk.keep(cand.name, trial, result)
            return
        step.decision = "dropped"
        step.why = (
            "not confirmed: measuring the incumbent again failed"
            if not again.ok
            else f"not confirmed: the incumbent measured again did not reach val_acc {self.target:.3f}"
            if again_missed
            else "not confirmed when the incumbent was measured again"
            + (f" (interval {ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
        )
        walk.dropped.append(cand.name)

    def _add_untried(self, walk: "_Walk") -> None:
        """A row for each candidate never tried, with why (the reason on the final configuration)."""
        for cand in self.candidates:
            if cand.name not in walk.tried:
                why = self._eligible(cand, walk.config, walk.kept) or (
                    "the budget ran out first" if walk.budget_hit else "not reached"
                )
                config = list(merge(walk.config, cand.overrides))
                self._add(Step(len(self.steps), cand.name, cand.group, "", config, "skipped", why))

    def _unit(self) -> str:
        return "" if self.target is None else " time to target"

    def _why_dropped(self, result: Result, ci: Optional[tuple]) -> str:
        if self.target is not None and result.to_target(self.target) is None:
            return (
                f"did not reach val_acc {self.target:.3f} in tune.verify_epochs={self.cfg.verify_epochs} epochs "
                f"(val_acc {_acc(result.val_acc)} at the end)"
            )
        if ci and ci[1] < 1.0:
            return f"slower: the interval {ci[0]:.2f}-{ci[1]:.2f} lies below 1.00"
        return "no measurable speed-up: " + (
            f"the interval {ci[0]:.2f}-{ci[1]:.2f} reaches 1.00" if ci else "too few epochs to judge"
        )

    def _guard(self, base: Result, base_verify: Result, path: List[List[str]], budget_hit: bool) -> Outcome:
        """The accuracy check down the path of kept configurations, then the winner and the baseline measured again."""
        if self.target is None:
            winner, winner_verify = self._accuracy_check(base_verify, path)
        else:  # every configuration on the path reached the target: that is its accuracy check
            winner = path[-1] if len(path) > 1 else []
            winner_verify = self.kept_results[_key(winner)] if winner else base_verify
        speed = ci = unconfirmed = None
        winner_probe: List[Result] = []
        if winner:
            speed, ci, winner_probe, unconfirmed = self._final_measurement(base, winner, winner_verify)
            if unconfirmed:
                winner, winner_verify, winner_probe, speed, ci = [], base_verify, [], None, None
        outcome = Outcome(
            winner=winner,
            speedup=speed,
            speedup_ci=ci,
            base_acc=base_verify.val_acc,
            winner_acc=winner_verify.val_acc,
            compile_s=winner_probe[0].compile_s if winner_probe else 0.0,
            base_epoch_s=self._epoch_s([base]),
            winner_epoch_s=self._epoch_s(winner_probe) if winner_probe else None,
            steps=self.steps,
            path=path,
            budget_hit=budget_hit,
            unconfirmed=unconfirmed,
            objective=self.objective,
            target=self.target,
            target_how=self.target_how,
        )
        outcome.verdict = verdict_text(outcome, self.cfg)
        return outcome

    def _final_measurement(self, base: Result, winner: List[str], winner_verify: Result) -> tuple:
        """The winner and the baseline measured again back to back: (speed-up over both measurements of
        each, its interval, the winner's measurements, None if confirmed else (speed-up, interval, why))."""
        first = self.kept_results[_key(winner)]
        base_again = self._measure("baseline-final", [])
        winner_again = self._measure("winner-final", winner)
        bases = [base] + ([base_again] if base_again.ok else [])
        winner_probe = [first] + ([winner_again] if winner_again.ok else [])
        speed, ci = self._compare(bases, winner_probe)
        # a winner that does not finish when measured again is no winner: the run that failed is the
        # newest evidence about it (a crash, an out-of-memory batch size), not a measurement to leave out
        failed = not winner_again.ok
        # time_to_target: reaching the target is the accuracy guard, so it must hold when measured again
        missed = self.target is not None and not failed and winner_again.to_target(self.target) is None
        confirmed = ci is not None and ci[0] > 1.0 and not missed and not failed
        final = self._add(self._step(len(self.steps), "final", "", "", winner, winner_again))
        final.decision = "final" if confirmed else "not confirmed"
        final.why = "the winner and the baseline measured again back to back; speed-up over both measurements of each"
        if failed:  # no second measurement of the winner: no speed-up over both of each to state
            speed = ci = None
            final.why = f"measured again, the winner failed ({winner_again.error}), so the configuration as given stays"
        elif missed:
            final.why += (
                f": measured again, the winner did not reach val_acc {self.target:.3f} in "
                f"tune.verify_epochs={self.cfg.verify_epochs} epochs, so the configuration as given stays"
            )
        elif not confirmed:
            final.why += ": the interval reaches 1.00, so the configuration as given stays"
        final.why += _unmeasured_again(base_again, self.target, "the baseline")
        final.epoch_time_s, final.compile_s = self._epoch_s(winner_probe), first.compile_s
        final.speedup, final.speedup_ci, final.vs_baseline = speed, ci, speed
        final.val_acc = winner_verify.val_acc
        if confirmed:
            return speed, ci, winner_probe, None
        why = (
            f"({' '.join(winner)}) failed when measured again ({winner_again.error})"
            if failed
            else f"it did not reach val_acc {self.target:.3f} when measured again"
            if missed
            else "not a measurable speed-up on this machine"
        )
        log.info(
            "the winner measured again with the baseline: %.2fx%s: %s, keeping the configuration as given",
            speed or 0.0,
            _fmt_ci(ci),
            why,
        )
        return speed, ci, winner_probe, (speed, ci, why)

    def _accuracy_check(self, base_verify: Result, path: List[List[str]]) -> tuple:
        """Walk back from the last kept configuration (the fastest) to the first whose val_acc is within tolerance
        of the baseline's, or that has no validation to check; return (its overrides, its verify run), or ([], the
        baseline's) when none passes."""
        tolerance = self.cfg.acc_tolerance
        for config in reversed(path[1:]):
            name = " ".join(config)
            check = self.probe("verify", "candidate", config)
            if not check.ok:
                self._add_check(config, "rejected", f"it did not train: {check.error}", check)
                log.info(
                    "accuracy check %s: it did not train (%s): checking the configuration before it", name, check.error
                )
                continue
            if base_verify.val_acc is not None and check.val_acc is None:
                # the baseline has an accuracy to keep and this run shows none: not a pass
                why = "its run logged no val_acc to compare with the baseline's (its validation is off or failed)"
                self._add_check(config, "rejected", why, check)
                log.info("accuracy check %s: no val_acc to compare: checking the configuration before it", name)
                continue
            if base_verify.val_acc is None:
                why = "trained, but accuracy NOT CHECKED: this run has no validation (data.val_samples / trainer.limit_val_batches)"
                self._add_check(config, "verified", why, check)
                log.warning(
                    "accuracy check %s: trained, but this run has no validation: its accuracy is not checked", name
                )
                return config, check
            # accuracies are k/N: exactly at the edge passes
            if check.val_acc >= base_verify.val_acc - tolerance - 1e-12:
                why = f"val_acc {check.val_acc:.3f} vs baseline {base_verify.val_acc:.3f} (tolerance {tolerance:g})"
                self._add_check(config, "verified", why, check, check.val_acc)
                log.info("accuracy check %s: val_acc %.3f vs %.3f: kept", name, check.val_acc, base_verify.val_acc)
                return config, check
            why = (
                f"val_acc {check.val_acc:.3f} is more than {tolerance:g} below the baseline's {base_verify.val_acc:.3f}"
            )
            self._add_check(config, "rejected", why, check, check.val_acc)
            log.info(
                "accuracy check %s: val_acc %.3f vs %.3f: REJECTED, checking the configuration before it",
                name,
                check.val_acc,
                base_verify.val_acc,
            )
        return [], base_verify

    def _add_check(self, config: List[str], decision: str, why: str, check: Result, val_acc=None) -> None:
        """One accuracy-check row of the tune report."""
        self._add(
            Step(len(self.steps), "accuracy check", "", "", config, decision, why, val_acc=val_acc, dir=check.dir)
        )


def _key(config: List[str]) -> str:
    return " ".join(sorted(config))


def _acc(value: Optional[float]) -> str:
    return f"{value:.3f}" if value is not None else "n/a"


def verdict_text(o: Outcome, cfg: Any) -> str:
    if not o.winner and o.unconfirmed:
        speed, ci, why = o.unconfirmed
        if speed is None:  # it did not finish when measured again: no speed-up to state
            return (
                f"keep the configuration as given: the best configuration found {why}"
                + (" (the budget ran out before every candidate was tried)" if o.budget_hit else "")
                + "."
            )
        return (
            f"keep the configuration as given: the best configuration found measured {speed or 0:.2f}x{_fmt_ci(ci)} when "
            f"measured again back to back with it: {why}"
            + (" (the budget ran out before every candidate was tried)" if o.budget_hit else "")
            + "."
        )
    if not o.winner and o.target is not None:
        return (
            f"keep the configuration as given: no candidate reached val_acc {o.target:.3f} measurably sooner "
            "(judged on one seed, timing noise only)"
            + (" (the budget ran out before every candidate was tried)" if o.budget_hit else "")
            + "."
        )
    if not o.winner:
        return (
            "keep the configuration as given: no candidate gave a measurable speed-up that kept the accuracy"
            + (" (the budget ran out before every candidate was tried)" if o.budget_hit else "")
            + "."
        )
    if o.target is not None:
        return (
            f"fastest configuration to val_acc {o.target:.3f}: {' '.join(o.winner)}: {o.speedup:.2f}x{_fmt_ci(o.speedup_ci)} "
            f"time to target vs the configuration as given (compile included), judged on one seed: the interval holds "
            f"timing noise only, not the seeds' say in how many epochs it takes (a sweep of both with {SEEDED_REPEATS} "
            "judges it across seeds)"
            + ("; the budget ran out before every candidate was tried" if o.budget_hit else "")
            + "."
        )
    checked = o.base_acc is not None and o.winner_acc is not None
    text = (
        f"fastest {'accuracy-safe ' if checked else ''}configuration: {' '.join(o.winner)}: "
        f"{o.speedup:.2f}x{_fmt_ci(o.speedup_ci)} vs the configuration as given"
    )
    if o.compile_s:
        text += f" (compile {o.compile_s:.1f} s, spread over {cfg.horizon_epochs} epochs)"
    if not checked:
        text += "; accuracy NOT CHECKED (the run has no validation)"
    else:
        text += f"; val_acc {_acc(o.winner_acc)} vs {_acc(o.base_acc)} after {cfg.verify_epochs} epochs (tolerance {cfg.acc_tolerance:g})"
    if o.budget_hit:
        text += "; the budget ran out before every candidate was tried"
    return text + "."
