"""The gate's verdicts: did any point of a suite get slower than at a baseline commit, measured tonight?

Every point is screened in a few pairs, the leaders refined, and only the suspects confirmed, each at its share of
alpha, so a night's chance of any false claim stays within alpha. Why each part is built so, with its simulations:
docs/decision-rules.md#the-gate-screen-refine-confirm.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pandas as pd
from scipy import stats

from decisions import intervals, sequential
from decisions.rundata import RunData, load_run
from decisions.verdicts import PointVerdict, contention_note, judge_pair_point, match_key, pairs_of
from rlperf.store import Store, point_label

GATE = "gate"
REGRESSED, PASSED, NOT_CONFIRMED, UNMEASURED, UNDECIDED, SKIPPED = (
    "regressed", "passed", "not confirmed", "could not measure", "undecided", "skipped")
EXIT_PASSED, EXIT_REGRESSED, EXIT_UNMEASURED = 0, 1, 3


@dataclass(frozen=True)
class GatePlan:
    """How a gate decides; stored with its runs, so a report judges them as the gate did."""

    threshold: float
    alpha: float
    screen_pairs: int
    screen_at: float  # a suspect's screen estimate is slower than this fraction
    max_suspects: int
    max_pairs: int  # of one suspect's confirmation
    min_quiet: int  # quiet screen pairs a point needs to be judged at all
    # Each field after these says how the gate decides now; its default is how plans stored without it decided
    # (docs/results-format.md, `gate`), so an older night is judged again as it was.
    ranking: str = "estimate"  # "evidence": likelier slowed by `screen_toward` than unchanged, strongest first
    screen_toward: float = 0.0
    statistic: str = sequential.SIGNED_RANK  # the confirmation's sign-flip score (decisions/sequential.py)
    refine_points: int = 0  # the strongest after the screen get `refine_pairs` more pairs before suspects are chosen
    refine_pairs: int = 0
    lead_share: float = 0.0  # the strongest suspect's share of alpha; a claimed suspect passes its level on
    spread_cap: float = 0.0  # the night's pair spread at most this many times the spread within points
    # each point's pair spread on earlier nights relative to the points' median (relative_spreads); empty: one
    # spread for every point
    point_spreads: dict[str, float] = field(default_factory=dict)
    night_end_undecided: bool = False  # a suspect the night ended before it decided is `undecided`, and fails
    # a night run weaker than its promise (--accept-weaker): a suspect beyond those confirmed is `undecided`
    beyond_undecided: bool = False

    def shares(self, suspects: int) -> list[float]:
        """Each suspect's own share of alpha, in the order they are confirmed."""
        if suspects <= 1:
            return [1.0]
        if not self.lead_share:
            return [1 / suspects] * suspects
        return [self.lead_share] + [(1 - self.lead_share) / (suspects - 1)] * (suspects - 1)

    def confirmation(self, suspects: int, index: int = 0, claimed: tuple[bool, ...] = ()) -> sequential.Design:
        """The design of suspect `index` of `suspects`, in the order confirmed, given which of those before it were
        claimed (`claimed[i]` for suspect i; none where left out): at its share of alpha, plus the level of the
        suspect just before it where that one was claimed (only where the plan has a `lead_share`)."""
        shares = self.shares(max(1, suspects))
        level = 0.0
        for at in range(index + 1):
            passed = level if self.lead_share and 0 < at <= len(claimed) and claimed[at - 1] else 0.0
            level = shares[at] + passed
        return sequential.Design.plan(self.max_pairs, self.alpha * level, sides=1, threshold=self.threshold,
                                      statistic=self.statistic)

    def screen_rule(self) -> str:
        """The screen's rule in words, for a report."""
        if self.ranking == "evidence":
            spread = ("the night's pair spread times the point's own relative to the others on earlier nights"
                      if self.point_spreads else "the night's pair spread")
            return (f"a point whose pairs are at least 1/e as likely {self.screen_toward:.0%} slower as unchanged "
                    f"(heavy-tailed noise at {spread}) is a suspect, the strongest evidence first")
        return f"a point whose pairs' estimate is slower than {self.screen_at:.0%} is a suspect, the slowest first"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "GatePlan":
        return cls(**data)


@dataclass
class Screened:
    """One point after the screen."""

    key: str  # match key: the point across runs
    point_key: str
    label: str
    status: str  # "ok", "failed" or "skipped" (the stored point's)
    reason: str = ""
    pairs: int = 0
    quiet: int = 0
    estimate: float = math.nan  # relative change, Hodges-Lehmann of the quiet pairs' log ratios
    spread: float = math.nan  # robust SD of those log ratios
    suspect: bool = False
    evidence: float = math.nan  # log likelihood ratio of "slower by the plan's screen_toward" over "unchanged"
    ratios: tuple[float, ...] = ()  # the quiet pairs' log ratios, new over ref


@dataclass
class GateVerdict:
    point: str
    status: str
    screen: Screened
    confirmation: PointVerdict | None = None
    note: str = ""


def screen_point(key: str, candidate: pd.Series, baseline: pd.Series, cand_rows: pd.DataFrame,
                 base_rows: pd.DataFrame, plan: GatePlan) -> Screened:
    label = point_label(candidate["point_key"])
    screened = Screened(key, candidate["point_key"], label, candidate["status"])
    if candidate["status"] != "ok" or baseline["status"] != "ok":
        failed = candidate if candidate["status"] != "ok" else baseline
        screened.status = failed["status"]
        screened.reason = (failed["reason"] or "no reason given").strip().splitlines()[0]
        return screened
    pairs = pairs_of(cand_rows, base_rows)
    quiet = pairs[~pairs["contended_ref"] & ~pairs["contended_new"]]
    screened.pairs, screened.quiet = len(pairs), len(quiet)
    screened.reason = contention_note(pairs)
    if len(quiet):
        ratios = np.log(quiet["sps_new"].to_numpy(float)) - np.log(quiet["sps_ref"].to_numpy(float))
        screened.ratios = tuple(ratios)
        screened.estimate = math.expm1(sequential.hodges_lehmann(ratios))
        screened.spread = sequential.pair_spread(ratios)
    screened.suspect = screened.quiet >= plan.min_quiet and screened.estimate < -plan.screen_at
    return screened


# A point is a suspect when its pairs are at least e^EVIDENCE_BAR times as likely slowed by `screen_toward` as
# unchanged: below even odds, to keep slowed points that met wide processes (docs/decision-rules.md#each-parts-reasons).
EVIDENCE_BAR = -1.0
EVIDENCE_GRID = 64  # slowdowns tried between `screen_toward` and the slowest pair
# the night's pair spread is not trusted below this (log ratio): a handful of pairs can agree by chance
SCALE_FLOOR = 0.005


def night_scale(screened: list[Screened], cap: float = 0.0) -> float:
    """The night's pair spread: a robust SD of every quiet pair of the screen, all points together, so that
    what moves a point's pairs together on a night counts as noise. Points that got slower widen it too, and
    where half the points moved it breaks down (in a suite of two with one slowed, the other became a suspect):
    so with a `cap` it is taken at most `cap` times the spread within points, from the differences between one
    point's pairs, which no point's move widens."""
    ratios = np.concatenate([s.ratios for s in screened if s.ratios] or [np.zeros(0)])
    if len(ratios) < 2:
        return SCALE_FLOOR
    spread = float(stats.median_abs_deviation(ratios, scale="normal"))
    if cap:
        within = spread_within([s.ratios for s in screened])
        if math.isfinite(within):
            spread = min(spread, cap * within)
    return max(SCALE_FLOOR, spread)


def spread_within(groups: list[tuple[float, ...]]) -> float:
    """A robust SD of pairs' log ratios from the differences between pairs of one group (a point's pairs of one
    night), which no move of the point, that night or any other, widens; NaN from fewer than two differences."""
    differences = np.concatenate([np.subtract.outer(g, g)[np.triu_indices(len(g), 1)] for g in groups if len(g)]
                                 or [np.zeros(0)])
    if len(differences) < 2:
        return math.nan
    # a difference of two pairs spreads sqrt(2) times as wide as one pair; |d|'s median is 0.674 of its SD
    return float(np.median(np.abs(differences))) / (stats.norm.ppf(0.75) * math.sqrt(2))


# degrees of freedom (pairs less one, each night) a point's earlier pairs need before its own spread counts
MIN_SPREAD_DF = 4
# the sampling variance of the log of a median-based SD from `df` degrees of freedom is about this over df (1/0.37
# of the SD's own: the median's efficiency at the normal law)
LOG_SPREAD_VARIANCE = 1.36


def relative_spreads(history: dict[str, list[tuple[float, ...]]]) -> dict[str, float]:
    """Each point's pair spread (key: point key) relative to the points' median, from its pairs on earlier nights
    (`history`: each night's log ratios, which the spread is read within, so no move of a point counts).

    A few nights give each point's spread only roughly, so the log spreads are shrunk toward their median by how much
    more they differ than their sampling error explains (empirical Bayes): points that are alike come out alike,
    points that differ keep most of it. A point with fewer than MIN_SPREAD_DF degrees of freedom is taken at the
    median; without two such points, or with no difference between them beyond chance, there is nothing to tell the
    points apart by: empty."""
    df = {key: sum(max(0, len(night) - 1) for night in nights) for key, nights in history.items()}
    logs = {key: math.log(spread) for key, nights in history.items()
            if df[key] >= MIN_SPREAD_DF and (spread := spread_within(nights)) > 0}
    center = float(np.median(list(logs.values()))) if logs else 0.0
    sampling = float(np.mean([LOG_SPREAD_VARIANCE / df[key] for key in logs])) if logs else 0.0
    between = max(0.0, float(np.var(list(logs.values()))) - sampling) if len(logs) >= 2 else 0.0
    if not between:
        return {}
    kept = between / (between + sampling)
    return {key: math.exp(kept * (logs[key] - center)) if key in logs else 1.0 for key in history}


def screen_allocation(history: dict[str, list[tuple[float, ...]]], plan: GatePlan) -> dict[str, int]:
    """The screen's pairs for each point (key: point key) from its pairs on earlier nights (`history`: each night's
    log ratios): `plan.screen_pairs` a point on average, shared in proportion to each point's pair spread
    (`relative_spreads`; Neyman's allocation, which makes the sum of the points' estimate variances least for the
    pairs spent), at least `plan.min_quiet` and at most twice `plan.screen_pairs` a point. A share in proportion to
    the variance would give each point the same power, but it doubles the error of the spreads in the shares: with
    eight nights of history at the H100's noise it gave eager points 2 to 6 pairs. Where the earlier nights do not
    tell the points apart, every point gets `plan.screen_pairs`."""
    weights = relative_spreads(history)
    if not weights:
        return {key: plan.screen_pairs for key in history}
    low, high = plan.min_quiet, 2 * plan.screen_pairs
    fixed: dict[str, float] = {}
    while True:  # those a proportional share would take past a bound are held at it, the rest share what is left
        free = {key: weight for key, weight in weights.items() if key not in fixed}
        left = plan.screen_pairs * len(weights) - sum(fixed.values())
        shares = {key: left * weight / sum(free.values()) for key, weight in free.items()} if free else {}
        beyond = {key: (low if share < low else high) for key, share in shares.items() if not low <= share <= high}
        if not beyond:
            break
        fixed.update(beyond)
    return {key: int(min(high, max(low, round(fixed.get(key, shares.get(key, low)))))) for key in weights}


def evidence(ratios: np.ndarray, scale: float, toward: float) -> np.ndarray:
    """Log likelihood ratio of pairs (last axis) slowed by at least `toward` (the likeliest such slowdown) over
    unchanged, each pair's log ratio drawn from a Cauchy law of width `scale`: a pair far out, wherever it falls,
    counts little."""
    ratios = np.asarray(ratios, float)
    nearest = math.log1p(-toward)
    # the likeliest slowdown lies near one of the pairs (or at `toward` itself): a grid down to the slowest pair
    slowest = min(nearest, float(ratios.min())) if ratios.size else nearest
    shifts = np.linspace(nearest, slowest, EVIDENCE_GRID)
    slowed = stats.cauchy.logpdf((ratios[..., None, :] - shifts[:, None]) / scale).sum(axis=-1).max(axis=-1)
    return slowed - stats.cauchy.logpdf(ratios / scale).sum(axis=-1)


def screen(new_points: pd.DataFrame, new_samples: pd.DataFrame, ref_points: pd.DataFrame,
           ref_samples: pd.DataFrame, plan: GatePlan) -> list[Screened]:
    """Every point of the screen's two runs, in the suite's order."""
    refs = {match_key(row["point_key"], row["config"]): row for _, row in ref_points.iterrows()}
    found = []
    for _, row in new_points.iterrows():
        key = match_key(row["point_key"], row["config"])
        ref = refs.get(key, row)
        found.append(screen_point(key, row, ref, new_samples[new_samples["point_key"] == row["point_key"]],
                                  ref_samples[ref_samples["point_key"] == ref["point_key"]], plan))
    if plan.ranking == "evidence":
        # the night's spread read in each point's own units, so a point's usual noise sets how far out its pairs are
        relative = {point.key: plan.point_spreads.get(point.point_key, 1.0) for point in found}
        scale = night_scale([replace(point, ratios=tuple(np.divide(point.ratios, relative[point.key])))
                             for point in found], plan.spread_cap)
        for point in found:
            if point.ratios:
                point.evidence = float(evidence(np.array(point.ratios), scale * relative[point.key],
                                                plan.screen_toward))
            point.suspect = point.quiet >= plan.min_quiet and point.evidence > EVIDENCE_BAR
    return found


def leaders(screened: list[Screened], plan: GatePlan) -> list[Screened]:
    """The points the screen's refinement measures again: the strongest evidence first, at most
    `refine_points` of those with enough quiet pairs."""
    if plan.ranking != "evidence" or not plan.refine_pairs:
        return []
    judged = [s for s in screened if s.quiet >= plan.min_quiet and math.isfinite(s.evidence)]
    return sorted(judged, key=lambda s: -s.evidence)[:plan.refine_points]


def suspects(screened: list[Screened], plan: GatePlan) -> list[Screened]:
    """The suspects the gate confirms, at most `max_suspects`: the strongest evidence first, or by the older
    rule the slowest first."""
    if plan.ranking == "evidence":
        return sorted((s for s in screened if s.suspect), key=lambda s: -s.evidence)[:plan.max_suspects]
    return sorted((s for s in screened if s.suspect), key=lambda s: s.estimate)[:plan.max_suspects]


def confirmation_designs(chosen: list[Screened], confirmed: dict[str, PointVerdict], plan: GatePlan,
                         suspects: int | None = None) -> dict[str, sequential.Design]:
    """Each of the `chosen` suspects' design, in the order confirmed, given the claims of those before it;
    `suspects` when the chosen are the first few of more."""
    designs, claimed = {}, []
    for index, suspect in enumerate(chosen):
        designs[suspect.key] = plan.confirmation(suspects or len(chosen), index, tuple(claimed))
        verdict = confirmed.get(suspect.key)
        claimed.append(verdict is not None and verdict.status == sequential.REGRESSED)
    return designs


def verdicts(screened: list[Screened], confirmed: dict[str, PointVerdict], plan: GatePlan) -> list[GateVerdict]:
    """One verdict per screened point; `confirmed` maps a suspect's key to its confirmation's verdict (judged
    by its design in `confirmation_designs`), as far as it got."""
    designs = confirmation_designs(suspects(screened, plan), confirmed, plan)
    out = []
    for point in screened:
        verdict = GateVerdict(point.label, PASSED, point)
        if point.status == "skipped":
            verdict.status, verdict.note = SKIPPED, point.reason
        elif point.status != "ok":
            verdict.status, verdict.note = UNMEASURED, f"{point.status}: {point.reason}"
        elif point.quiet < plan.min_quiet:
            verdict.status = UNMEASURED
            verdict.note = (f"too few quiet pairs: {point.quiet} of {point.pairs} (at least {plan.min_quiet}); "
                            f"the others ran on a contended machine")
        elif point.key in designs:
            confirm_point(verdict, confirmed.get(point.key), designs[point.key], plan.night_end_undecided)
        elif point.suspect and plan.beyond_undecided:
            verdict.status = UNDECIDED
            verdict.note = f"a suspect beyond the {plan.max_suspects} the weaker night confirms"
        elif point.suspect:
            verdict.status = NOT_CONFIRMED
            verdict.note = f"a suspect beyond the {plan.max_suspects} the gate confirms"
        out.append(verdict)
    return out


def confirm_point(verdict: GateVerdict, confirmation: PointVerdict | None, design: sequential.Design,
                  night_end_undecided: bool = False) -> None:
    """A suspect's verdict from its confirmation; with `night_end_undecided`, one the night ended before it decided
    (no pair at all, or fewer pairs than its design's most and no stop) is `undecided`."""
    verdict.confirmation = confirmation
    if confirmation is None:
        verdict.status, verdict.note = UNMEASURED, "a suspect whose confirmation was not measured"
    elif confirmation.status == "failed":
        verdict.status, verdict.note = UNMEASURED, f"confirmation failed: {confirmation.reason}"
    elif confirmation.status == sequential.REGRESSED:
        verdict.status, verdict.note = REGRESSED, confirmation.reason
    elif confirmation.decision is not None and confirmation.decision.pairs < design.looks[0] \
            and confirmation.status == sequential.INCONCLUSIVE \
            and confirmation.decision.pairs + sum(confirmation.contended) >= design.looks[0]:
        verdict.status = UNMEASURED
        verdict.note = (f"confirmation reached {confirmation.decision.pairs} quiet pairs, short of its first look "
                        f"at {design.looks[0]}: {confirmation.reason}")
    elif night_end_undecided and confirmation.status == "skipped":
        verdict.status, verdict.note = UNDECIDED, f"the night ended before its first pair: {confirmation.reason}"
    elif night_end_undecided and cut_short(confirmation, design):
        pairs = confirmation.decision.pairs + sum(confirmation.contended)
        verdict.status = UNDECIDED
        verdict.note = (f"the night ended after {pairs} of its pairs, {confirmation.decision.pairs} of them quiet, "
                        f"of the {design.max_pairs} its design allows: {confirmation.reason}")
    else:
        verdict.status = NOT_CONFIRMED
        verdict.note = f"confirmation: {confirmation.status}; {confirmation.reason}".rstrip("; ")


def cut_short(confirmation: PointVerdict, design: sequential.Design) -> bool:
    """A confirmation that ended inconclusive before its design's most pairs: only the night's end stops one
    there (a failed process is its own status)."""
    decision = confirmation.decision
    return (confirmation.status == sequential.INCONCLUSIVE and decision is not None
            and decision.pairs + sum(confirmation.contended) < design.max_pairs)


def grown(confirmation: PointVerdict) -> str:
    """` (learn grew)`: the phases whose time per step grew in the confirmation's pairs, the largest first."""
    names = [phase for phase, _ in confirmation.phases_grew]
    return f" ({', '.join(names)} grew)" if names else ""


def conclusion(found: list[GateVerdict]) -> str:
    """The gate's last line: what failed it, or that nothing did."""
    def named(status: str) -> list[GateVerdict]:
        return [v for v in found if v.status == status]

    def count(things: list, noun: str) -> str:
        return f"{len(things)} {noun}{'' if len(things) == 1 else 's'}"

    if named(REGRESSED):
        return "gate: regressed: " + "; ".join(
            f"{v.point} {v.confirmation.sps.relative:+.1%}{grown(v.confirmation)}" for v in named(REGRESSED))
    failed = []
    if named(UNMEASURED):
        failed.append(f"could not measure {count(named(UNMEASURED), 'point')}: " + "; ".join(
            f"{v.point} ({v.note})" for v in named(UNMEASURED)))
    ended = [v for v in named(UNDECIDED) if v.confirmation is not None]
    if ended:
        failed.append(f"undecided {count(ended, 'suspect')} (the night ended first: raise --night-s): "
                      + "; ".join(f"{v.point} ({v.note.split(': ')[0]})" for v in ended))
    if beyond := [v for v in named(UNDECIDED) if v.confirmation is None]:
        failed.append(f"undecided {count(beyond, 'suspect')} beyond the weaker night's confirmed (raise --night-s): "
                      + "; ".join(v.point for v in beyond))
    if failed:
        return "gate: " + "; ".join(failed)
    confirmed = [v for v in found if v.confirmation is not None]
    beyond = [v for v in found if v.status == NOT_CONFIRMED and v.confirmation is None]
    return (f"gate: no point got slower ({count(found, 'point')}, {len(named(SKIPPED))} skipped, "
            f"{count(confirmed, 'suspect')} not confirmed"
            + (f"; beyond those confirmed: {', '.join(v.point for v in beyond)}" if beyond else "") + ")")


def summary_row(verdict: GateVerdict) -> dict:
    """One point's verdict as plain data (the gate's --summary)."""
    confirmation = verdict.confirmation
    sps = confirmation.sps if confirmation is not None else None
    finite = (lambda value: value if value is not None and math.isfinite(value) else None)
    return {"point": verdict.point, "status": verdict.status, "note": verdict.note,
            "screen": {"estimate": finite(verdict.screen.estimate), "quiet_pairs": verdict.screen.quiet,
                       "pairs": verdict.screen.pairs, "pair_spread": finite(verdict.screen.spread)},
            "confirmation": None if sps is None else {
                "estimate": finite(sps.relative), "low": finite(sps.low), "high": finite(sps.high),
                "quiet_pairs": sps.n_candidate, "status": confirmation.status}}


def as_point_verdicts(found: list[GateVerdict]) -> list[PointVerdict]:
    """The gate's verdicts in the report's terms: each point's status, with its confirmation's change."""
    out = []
    for verdict in found:
        confirmation = verdict.confirmation
        out.append(PointVerdict(verdict.screen.key, verdict.point, verdict.status, verdict.note,
                                sps=confirmation.sps if confirmation else None,
                                decision=confirmation.decision if confirmation else None))
    return out


# ---- a gate's runs in the store ----------------------------------------------------------------------------------

def screen_pair_plan(candidate: RunData, baseline: RunData) -> GatePlan | None:
    """The gate's plan when these are the working tree's and the baseline's screen runs of one gate."""
    entry = candidate.fingerprint.get(GATE) or {}
    if (entry.get("stage"), entry.get("side")) != ("screen", "new") or candidate.store_path != baseline.store_path \
            or (entry.get("runs") or {}).get("screen_ref") != baseline.run_id:
        return None
    return GatePlan.from_dict(entry["plan"])


def stored_verdicts(candidate: RunData, baseline: RunData, plan: GatePlan) -> list[GateVerdict]:
    """The gate's verdicts rebuilt from its stored runs: the screen from these two and the refinement's pairs,
    the confirmation from the runs that name them."""
    with Store.open(candidate.store_path, readonly=True) as store:
        later: dict[str, dict[str, RunData]] = {}
        for row in store.runs().itertuples():
            entry = row.fingerprint.get(GATE) or {}
            if entry.get("stage") in ("refine", "confirm") \
                    and (entry.get("runs") or {}).get("screen_new") == candidate.run_id:
                later.setdefault(entry["stage"], {})[entry["side"]] = load_run(store, row.run_id)
    samples = {"new": candidate.samples, "ref": baseline.samples}
    if set(later.get("refine", {})) == {"ref", "new"}:
        samples = {side: pd.concat([frame, later["refine"][side].samples], ignore_index=True)
                   for side, frame in samples.items()}
    screened = screen(candidate.points, samples["new"], baseline.points, samples["ref"], plan)
    chosen = suspects(screened, plan)
    confirmed: dict[str, PointVerdict] = {}
    sides = later.get("confirm", {})
    if chosen and set(sides) == {"ref", "new"}:
        for index, suspect in enumerate(chosen):
            # in the order confirmed: a claim passes its level on to the next suspect
            design = confirmation_designs(chosen[:index + 1], confirmed, plan, len(chosen))[suspect.key]
            new, ref = (sides[side].samples[sides[side].samples["point_key"] == suspect.point_key]
                        for side in ("new", "ref"))
            statuses = {side: sides[side].points.set_index("point_key")["status"].get(suspect.point_key)
                        for side in ("new", "ref")}
            if None in statuses.values():
                continue
            if set(statuses.values()) == {"skipped"}:  # the night had no time left for it
                reason = sides["new"].points.set_index("point_key")["reason"].get(suspect.point_key) or ""
                confirmed[suspect.key] = PointVerdict(suspect.key, suspect.label, "skipped", reason)
            elif set(statuses.values()) != {"ok"}:
                failed = next(side for side, status in statuses.items() if status != "ok")
                reason = sides[failed].points.set_index("point_key")["reason"].get(suspect.point_key) or ""
                confirmed[suspect.key] = PointVerdict(suspect.key, suspect.label, "failed",
                                                      (reason.strip().splitlines() or [""])[0])
            elif len(new) and len(ref):
                confirmed[suspect.key] = judge_pair_point(new, ref, design, ended=True)
    return verdicts(screened, confirmed, plan)


def exit_code(found: list[GateVerdict]) -> int:
    statuses = {v.status for v in found}
    if REGRESSED in statuses:
        return EXIT_REGRESSED
    return EXIT_UNMEASURED if statuses & {UNMEASURED, UNDECIDED} else EXIT_PASSED


# ---- what the gate can detect -----------------------------------------------------------------------------------

def detectable(plan: GatePlan, spread: float, power: float = sequential.DETECTION_POWER) -> float:
    """The smallest slowdown of one point that the gate flags with `power` when that point's pairs spread by
    `spread` and it is the night's only suspect: it must be a suspect in the screen, then confirmed at alpha.
    inf when no slowdown short of 99% is flagged that often."""
    if not math.isfinite(spread) or spread <= 0:
        return math.inf
    design = plan.confirmation(1)
    rounded = round(spread, 4)
    return intervals.smallest_with_power(
        lambda slowdown: screen_power(plan, rounded, slowdown) * sequential.claim_power(design, rounded, slowdown),
        power)


def point_detectable(plan: GatePlan, screen: Screened) -> float:
    """`detectable` for one screened point at its own quiet pairs, which the screen's share (and, for a leader,
    the refinement) gave it, rather than the plan's average."""
    return detectable(replace(plan, screen_pairs=max(plan.min_quiet, screen.quiet)), screen.spread)


def screen_power(plan: GatePlan, spread: float, slowdown: float) -> float:
    """The chance a point slower by `slowdown` becomes a suspect, its pairs spreading by `spread` (normal)."""
    rng = np.random.default_rng(1)
    pairs = math.log1p(-slowdown) + rng.standard_normal((sequential.DETECTION_DRAWS, plan.screen_pairs)) * spread
    if plan.ranking == "evidence":  # the night's pair spread taken as this point's
        return float(np.mean(evidence(pairs, max(SCALE_FLOOR, spread), plan.screen_toward) > EVIDENCE_BAR))
    i, j = np.triu_indices(plan.screen_pairs)
    estimates = np.median((pairs[:, i] + pairs[:, j]) / 2, axis=1)
    return float(np.mean(estimates < math.log1p(-plan.screen_at)))
