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
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ..report import speedup_interval
from .candidates import EXTRA, ORDER, Candidate, Context, settings_of
from .probe import Result

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
    unconfirmed: Optional[tuple] = None  # (speedup, interval) of a winner the final measurement did not confirm


def merge(config: List[str], overrides: tuple) -> List[str]:
    """``config`` with ``overrides`` applied: a key set again replaces its earlier value."""
    by_key = {ov.partition("=")[0]: ov for ov in config}
    for ov in overrides:
        by_key[ov.partition("=")[0]] = ov
    return list(by_key.values())


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

    # -- measurement -------------------------------------------------------------------------
    def _times(self, results: List[Result]) -> List[List[float]]:
        return [r.epoch_times(self.full_samples, self.cfg.horizon_epochs) for r in results if r.ok]

    def _compare(self, base: List[Result], other: List[Result]) -> tuple:
        """(speedup of ``other`` over ``base``, its interval) from pooled full-epoch times."""
        b, o = self._times(base), self._times(other)
        if not b or not o:
            return None, None
        speed = statistics.median([t for r in b for t in r]) / statistics.median([t for r in o for t in r])
        return speed, speedup_interval(b, o)

    def _epoch_s(self, results: List[Result]) -> Optional[float]:
        times = [t for r in self._times(results) for t in r]
        return statistics.median(times) if times else None

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
        groups = ORDER.get(verdict, ORDER["compute"]) + [EXTRA]
        for group in groups:
            for cand in self.candidates:
                if cand.group == group and cand.name not in tried and self._eligible(cand, config, kept) is None:
                    return cand
        return None

    def run(self) -> Outcome:
        # why longer: one greedy search whose loop state (config, incumbent, kept, tried, dropped) every
        # branch reads and changes; split, those five values would be passed back and forth each turn
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

        base = self.probe("probe", "baseline", [])
        if not base.ok:
            raise RuntimeError(f"the baseline probe failed: {base.error} (see {base.dir})")
        self._add(
            Step(
                0,
                "baseline",
                "",
                "",
                [],
                "baseline",
                "the configuration as given",
                self._epoch_s([base]),
                base.compile_s,
                dir=base.dir,
            )
        )
        log.info("probe 0 baseline: %.3f s/epoch; %s", self._epoch_s([base]), base.verdict or "no verdict")

        config: List[str] = []
        incumbent: List[Result] = [base]
        kept: List[str] = []
        path = [[]]
        tried: Dict[str, int] = {}  # name -> len(kept) when tried (to retry after later keeps)
        dropped: List[str] = []
        budget_hit = False
        while True:
            if not self._budget_left():
                budget_hit = True
                break
            verdict = next((r.bottleneck for r in reversed(incumbent) if r.ok and r.bottleneck), None) or "compute"
            cand = self._next(verdict, config, kept, set(tried))
            if cand is None:  # all tried: once more, those dropped before a later keep
                retry = [name for name in dropped if tried[name] < len(kept)]
                cand = self._next(verdict, config, kept, set(tried) - set(retry))
                if cand is None:
                    break
                dropped.remove(cand.name)
            tried[cand.name] = len(kept)
            trial = merge(config, cand.overrides)
            n = len(self.steps)
            result = self.probe("probe", cand.name, trial)
            step = self._add(
                Step(
                    n,
                    cand.name,
                    cand.group,
                    verdict,
                    trial,
                    "",
                    "",
                    self._epoch_s([result]),
                    result.compile_s,
                    dir=result.dir,
                )
            )
            if not result.ok:
                step.decision, step.why = "failed", f"the probe failed: {result.error}"
                log.info("probe %d %s: failed (%s)", n, " ".join(cand.overrides), result.error)
                continue
            speed, ci = self._compare(incumbent, [result])
            step.speedup, step.speedup_ci = speed, ci
            step.vs_baseline = self._compare([base], [result])[0]
            if ci is None or ci[0] <= 1.0:
                step.decision = "dropped"
                step.why = "no measurable speed-up: " + (
                    f"the interval {ci[0]:.2f}-{ci[1]:.2f} reaches 1.00" if ci else "too few epochs to judge"
                )
                dropped.append(cand.name)
            else:
                again = self.probe("probe", "incumbent-again", config)  # right after: drift cannot fake a speed-up
                if again.ok:
                    incumbent.append(again)
                    speed, ci = self._compare(incumbent, [result])
                    step.speedup, step.speedup_ci = speed, ci
                if again.ok and ci is not None and ci[0] > 1.0:
                    step.decision, step.why = "kept", f"{speed:.2f}x over the incumbent, measured twice"
                    config, incumbent = trial, [result]
                    self.kept_results[_key(trial)] = result
                    kept.append(cand.name)
                    path.append(list(config))
                else:
                    step.decision = "dropped"
                    step.why = (
                        "not confirmed: measuring the incumbent again failed"
                        if not again.ok
                        else "not confirmed when the incumbent was measured again"
                        + (f" (interval {ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
                    )
                    dropped.append(cand.name)
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

        # candidates never tried: say why (the reason on the final configuration)
        for cand in self.candidates:
            if cand.name not in tried:
                why = self._eligible(cand, config, kept) or (
                    "the budget ran out first" if budget_hit else "not reached"
                )
                self._add(
                    Step(
                        len(self.steps), cand.name, cand.group, "", list(merge(config, cand.overrides)), "skipped", why
                    )
                )

        return self._guard(base, base_verify, path, budget_hit)

    def _guard(self, base: Result, base_verify: Result, path: List[List[str]], budget_hit: bool) -> Outcome:
        """The accuracy check down the path of kept configurations, then the winner and the baseline measured again."""
        winner, winner_verify = self._accuracy_check(base_verify, path)
        speed = ci = None
        unconfirmed = None
        winner_probe: List[Result] = []
        if winner:
            first = self.kept_results[_key(winner)]
            base_again = self.probe("probe", "baseline-final", [])
            winner_again = self.probe("probe", "winner-final", winner)
            bases = [base] + ([base_again] if base_again.ok else [])
            winner_probe = [first] + ([winner_again] if winner_again.ok else [])
            speed, ci = self._compare(bases, winner_probe)
            confirmed = ci is not None and ci[0] > 1.0
            self._add(
                Step(
                    len(self.steps),
                    "final",
                    "",
                    "",
                    winner,
                    "final" if confirmed else "not confirmed",
                    "the winner and the baseline measured again back to back; speed-up over both measurements of each"
                    + ("" if confirmed else ": the interval reaches 1.00, so the configuration as given stays"),
                    self._epoch_s(winner_probe),
                    first.compile_s,
                    speed,
                    ci,
                    speed,
                    winner_verify.val_acc,
                    winner_again.dir,
                )
            )
            if not confirmed:
                log.info(
                    "the winner measured again with the baseline: %.2fx%s: not a measurable speed-up, keeping the configuration as given",
                    speed or 0.0,
                    _fmt_ci(ci),
                )
                unconfirmed = (speed, ci)
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
        )
        outcome.verdict = verdict_text(outcome, self.cfg)
        return outcome

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
            if base_verify.val_acc is None or check.val_acc is None:
                why = "trained, but accuracy NOT CHECKED: this run has no validation (data.val_samples / trainer.limit_val_batches)"
                self._add_check(config, "verified", why, check)
                log.warning(
                    "accuracy check %s: trained, but this run has no validation: its accuracy is not checked", name
                )
                return config, check
            if check.val_acc >= base_verify.val_acc - tolerance:
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
        speed, ci = o.unconfirmed
        return (
            f"keep the configuration as given: the best configuration found measured {speed or 0:.2f}x{_fmt_ci(ci)} when "
            "measured again back to back with it, not a measurable speed-up on this machine"
            + (" (the budget ran out before every candidate was tried)" if o.budget_hit else "")
            + "."
        )
    if not o.winner:
        return (
            "keep the configuration as given: no candidate gave a measurable speed-up that kept the accuracy"
            + (" (the budget ran out before every candidate was tried)" if o.budget_hit else "")
            + "."
        )
    text = f"fastest accuracy-safe configuration: {' '.join(o.winner)}: {o.speedup:.2f}x{_fmt_ci(o.speedup_ci)} vs the configuration as given"
    if o.compile_s:
        text += f" (compile {o.compile_s:.1f} s, spread over {cfg.horizon_epochs} epochs)"
    if o.base_acc is None or o.winner_acc is None:
        text += "; accuracy NOT CHECKED (the run has no validation)"
    else:
        text += f"; val_acc {_acc(o.winner_acc)} vs {_acc(o.base_acc)} after {cfg.verify_epochs} epochs (tolerance {cfg.acc_tolerance:g})"
    if o.budget_hit:
        text += "; the budget ran out before every candidate was tried"
    return text + "."
