"""The report of one run: what was measured, where the time went, and, against a baseline, what changed."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from reports import figures, memory, roofline
from reports.formatting import fingerprint_section, fmt_change, fmt_detectable, fmt_p, fmt_sps, machine_line
from decisions.learning import LearningVerdict
from reports.learning_report import baseline_learning_section, knob_learning_section, learning_section
from reports.page import Report, Section, write_report
from decisions.rundata import RunData, env_overlap_per_step, knob_pairs, phase_us_per_step, point_table, swept_axes
from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD, check_criteria
from decisions import screening
from reports.history import MIN_OFFSET_RUNS, offset_text, suite_offset
from decisions.sequential import FUTILITY_ALPHA, Design, paired_design
from decisions.verdicts import (MIN_PHASE_GROWTH_SHARE, PointVerdict, exit_code, fmt_interval, judge, judge_pairs,
                              judge_point, tally)
from profilers.interference import OTHERS_CORES_LIMIT, STEAL_SHARE_LIMIT, contention
from profilers.sampler import CLOCK_EVENT_REASONS
from rlperf.errors import BadInput
from rlperf.machine import comparability_differences
from rlperf.store import point_label
from rlperf.summary import GRAPH_PHASES

UTILIZATION_METRICS = ("gpu_util_percent", "sm_clock_mhz", "power_w", "mem_used_bytes", "cpu_util_percent")
CLOCK_METRICS = ("sm_clock_mhz", "clock_event_reasons", "temperature_c")
PROFILED_NOTE = ("Traces come from separate profiled runs; the profiler's own overhead distorts throughput, so "
                 "no SPS figure in this report is ever taken from a profiled run.")


def check_baseline(candidate: RunData, baseline: RunData, allow_cross_machine: bool) -> None:
    if (candidate.store_path, candidate.run_id) == (baseline.store_path, baseline.run_id):
        raise BadInput(f"baseline: run {baseline.run_id} is the run being reported; name another run "
                       "(PATH::RUN_ID)")
    if baseline.suite != candidate.suite:
        raise BadInput(f"baseline: run {baseline.run_id} is of suite {baseline.suite!r}, not {candidate.suite!r}; "
                       "a baseline must run the same suite")
    if baseline.info["machine_key"] != candidate.info["machine_key"] and not allow_cross_machine:
        differences = comparability_differences(baseline.fingerprint, candidate.fingerprint)
        raise BadInput("baseline: measured on a machine that is not comparable ("
                       + ("; ".join(differences) or "machine keys differ")
                       + "); pass --allow-cross-machine to compare anyway")


def run_header(run: RunData) -> str:
    finished = run.info.get("finished_at") or "not finished"
    label = f" · label {run.info['label']}" if run.info.get("label") else ""
    return (f"run {run.run_id} · commit {run.commit} · {run.info['started_at']} → {finished} · "
            f"{run.info['status']}{label} · {machine_line(run.fingerprint)}")


def verdict_section(verdicts: list[PointVerdict], candidate: RunData, baseline: RunData, threshold: float,
                    alpha: float, design: Design | None = None) -> Section:
    rule = paired_rule_text(design) if design is not None else verdict_rule_text(threshold, alpha)
    text = [f"Baseline: {run_header(baseline)}.", rule]
    if design is None and candidate.store_path == baseline.store_path:
        offset, counted = suite_offset(candidate.store_path, candidate.suite, candidate.info["machine_key"])
        if counted >= MIN_OFFSET_RUNS:
            text.append(offset_text(offset, counted))
    if baseline.info["machine_key"] != candidate.info["machine_key"]:
        differences = comparability_differences(baseline.fingerprint, candidate.fingerprint)
        text.append("Warning: the baseline was measured on another machine (--allow-cross-machine): "
                    + ("; ".join(differences) or "machine keys differ") + ".")
    rows = []
    for verdict in verdicts:
        sps = verdict.sps
        grew = ", ".join(f"{phase} {fmt_change(change.relative)}" for phase, change in verdict.phases_grew)
        shrank = ", ".join(f"{phase} {fmt_change(change.relative)}" for phase, change in verdict.phases_shrank)
        if verdict.status == "regressed" and not grew:
            grew = "no single phase grew beyond the threshold"
        rows.append({
            "point": verdict.point, "status": verdict.status,
            "baseline SPS": fmt_sps(sps.baseline) if sps else "–",
            "SPS": fmt_sps(sps.candidate) if sps else "–",
            "change": f"{fmt_change(sps.relative)} {fmt_interval(sps)}" if sps else "–",
            "p beyond ±threshold": fmt_p(sps.p_value) if sps else "–",
            "detects": fmt_detectable(verdict.detectable) if sps else "–",
            ("quiet pairs" if design else "repeats (base/new)"):
                (str(sps.n_candidate) if design else f"{sps.n_baseline}/{sps.n_candidate}") if sps else "–",
            "phases that grew": grew, "phases that shrank": shrank, "note": verdict.reason,
        })
    return Section("Verdict against the baseline", text, [pd.DataFrame(rows)])


def confirmation_levels(plan: screening.GatePlan) -> str:
    if not plan.lead_share:
        return "alpha / suspects"
    return (f"its share of alpha ({plan.lead_share:.0%} for the strongest suspect, the others splitting the rest, "
            f"and a claimed suspect's level passed on to the next)")


def gate_section(found: list[screening.GateVerdict], plan: screening.GatePlan, baseline: RunData) -> Section:
    design = plan.confirmation(len([v for v in found if v.confirmation is not None]) or 1)
    text = [f"Baseline: {run_header(baseline)}, measured in the same job.",
            f"The gate measured both commits in pairs of processes, in an order drawn at random inside each pair. "
            f"Screen: {plan.screen_pairs} pairs a point on average, shared out by each point's pair spread in the "
            f"store's earlier screens where they tell the points apart (the screen column has each point's); "
            f"{plan.screen_rule()}. Confirm: the first "
            f"{plan.max_suspects} suspects at most, each in "
            f"fresh pairs judged sequentially at {confirmation_levels(plan)} (looks at "
            f"{', '.join(map(str, design.looks))} quiet pairs here), so the chance of flagging any point on a night "
            f"where nothing got slower is at most {plan.alpha:g}. 'detects' is the smallest slowdown the gate flags "
            f"95% of the time at the point's measured pair noise, when it is the night's only suspect.",
            screening.conclusion(found)]
    rows = []
    for verdict in found:
        screen, confirmation = verdict.screen, verdict.confirmation
        sps = confirmation.sps if confirmation is not None else None
        rows.append({
            "point": verdict.point, "status": verdict.status,
            "screen": f"{fmt_change(screen.estimate)} ({screen.quiet}/{screen.pairs} pairs)"
            if np.isfinite(screen.estimate) else "–",
            "pair noise": f"{screen.spread:.1%}" if np.isfinite(screen.spread) else "–",
            "confirmation": f"{fmt_change(sps.relative)} {fmt_interval(sps)} ({sps.n_candidate} pairs)" if sps else "–",
            "detects": fmt_detectable(screening.point_detectable(plan, screen)),
            "note": verdict.note or screen.reason,
        })
    return Section("Gate: did any point get slower?", text, [pd.DataFrame(rows)])


def verdict_rule_text(threshold: float, alpha: float) -> str:
    return (f"Each point's change is the Hodges–Lehmann shift of its repeats' steady SPS (one value per process, "
            f"on a log scale) with its exact {1 - alpha:.0%} Mann–Whitney confidence interval. Regressed or "
            f"improved: the interval excludes no change and the estimate lies beyond ±{threshold:.0%}, and the "
            f"claim survives Benjamini–Hochberg over all compared points at {alpha:g}. Unchanged: the whole "
            f"interval lies within ±{threshold:.0%}. Inconclusive: neither; the note says why and about how many "
            f"repeats a side would decide it. Repeats run on a contended machine are left out. 'detects' is the "
            f"smallest slowdown these repeats would catch 95% of the time, given their noise, at the level a lone "
            f"regression among these points must reach. The two runs were measured apart: the rule assumes they "
            f"differ by nothing but the code, so a slow night reads as a change of every point. To gate on a "
            f"change, measure both commits in one job, in pairs (`rlperf gate`, `rlperf bench --against`).")


def paired_rule_text(design: Design) -> str:
    looks = ", ".join(str(count) for count in design.looks)
    side = "slower or faster" if design.sides == 2 else "slower"
    return (f"The two runs were measured in pairs of processes, one of each in an order drawn at random, and are "
            f"judged by the design stored with them: each point's pairs are looked at after {looks} quiet pairs; "
            f"a point is {side} when the exact signed-rank test of the pairs' log ratios meets its look's level "
            f"(alpha {design.alpha:.3g} per point over every look) and the estimate lies beyond "
            f"±{design.threshold:.0%}; it stops as not slower (unchanged when also not faster) when the "
            f"{1 - 2 * FUTILITY_ALPHA:.0%} interval lies above −{design.threshold:.0%}. The change shown is "
            f"corrected for stopping early, with its interval; a pair is left out when either of its processes ran "
            f"on a contended machine.")


def sps_section(table: pd.DataFrame) -> Section:
    shown = pd.DataFrame({
        "point": table["label"], "status": table["status"],
        "SPS (median)": table["sps_median"].map(fmt_sps),
        "min – max": [f"{fmt_sps(lo)} – {fmt_sps(hi)}" if np.isfinite(lo) else "–"
                      for lo, hi in zip(table["sps_min"], table["sps_max"])],
        "repeats": table["repeats"],
        "contended": [f"{c}/{n}" if n else "–" for c, n in zip(table["contended"], table["repeats"])],
        "detects": [fmt_detectable(d) if n else "–" for d, n in zip(table["detects"], table["repeats"])],
        "end-to-end SPS": table["sps_end_to_end"].map(fmt_sps),
        "warm-up s": table["warmup_seconds"].map(lambda v: f"{v:.2f}" if np.isfinite(v) else "–"),
        "host→device B/step": table["h2d_bytes_per_step"].map(lambda v: f"{v:,.0f}" if np.isfinite(v) else "–"),
        "host→device MB/s": table["h2d_mb_per_s"].map(lambda v: f"{v:,.1f}" if np.isfinite(v) else "–"),
        "dtype used": table["dtype_used"], "device": table["device"],
        "episode return": table["mean_episode_return"].map(lambda v: f"{v:.3g}" if np.isfinite(v) else "–"),
        **memory.table_columns(table),
        "note": table["reason"],
    })
    measured = table[table["repeats"] > 0]
    figs = [figures.sps_per_point(measured)] if not measured.empty else []
    text = ["Steady steps per second exclude set-up, compilation and warm-up epochs; end-to-end SPS includes "
            "them. Each repeat is a separate trainer process. 'contended': repeats during which other processes "
            "used the machine (left out of verdicts); 'detects': the smallest slowdown the quiet repeats would "
            "catch 95% of the time against as many repeats as noisy. Host→device: the bytes the rollout copies "
            "into the experience buffers per agent step (observation, reward, done and, for envs that reset on the "
            "next step, valid flags), and per second at the median SPS. Peak RSS: the trainer process's peak resident "
            "set; peak device: the CUDA allocator's peak allocated and reserved bytes over the steady epochs; each "
            "the largest over the repeats."]
    return Section("Steps per second", text, [shown], figs)


def quiet_section(run: RunData) -> Section | None:
    """Per point: the trainer's own share of the CPUs against what other processes used, and why a repeat
    counts as contended (profilers/interference.py)."""
    rows = []
    for point_key, samples in run.samples.groupby("point_key", sort=False):
        accounts = [summary.interference for summary in samples["summary"] if summary.interference]
        if not accounts:
            continue
        frame = pd.DataFrame(accounts)
        kinds = pd.Series([kind for account in accounts for kind, _ in contention(account)], dtype=object)
        rows.append({
            "point": point_label(point_key), "contended": f"{int(frame['contended'].sum())}/{len(frame)}",
            "trainer cores (median)": f"{frame['trainer_cores'].median():.2f} of {int(frame['cores'].max())}",
            "others' cores (median / max)": f"{frame['others_cores'].median():.2f} / {frame['others_cores'].max():.2f}",
            "steal (max)": f"{frame['steal_share'].max():.1%}", "load (max)": f"{frame['load_1m'].max():.2f}",
            "why": ", ".join(f"{kind} ({count})" for kind, count in kinds.value_counts().items()),
        })
    if not rows:
        return None
    text = ["Each repeat is bracketed by the kernel's accounts: the trainer's own CPU time (in cores: CPU seconds "
            "per wall second) against the CPU other processes used meanwhile, steal and load; on GPUs, other "
            "programs' compute processes. A repeat is contended when others used more than "
            f"{OTHERS_CORES_LIMIT:g} of a core on average, steal took more than {STEAL_SHARE_LIMIT:.0%}, or another "
            "program computed on the GPU; verdicts leave contended repeats out."]
    return Section("Was the machine quiet?", text, [pd.DataFrame(rows)])


def phase_section(run: RunData) -> Section | None:
    if run.samples.empty:
        return None
    per_step = phase_us_per_step(run)
    shares = per_step.div(per_step.sum(axis=1), axis=0)
    shown = pd.DataFrame({"point": per_step.index})
    for phase in per_step.columns:
        shown[phase] = [f"{us:.2f} µs ({share:.0%})" for us, share in zip(per_step[phase], shares[phase])]
    text = ["Microseconds per agent step spent in each phase over the steady epochs (median of repeats) and "
            "the phase's share of the step."]
    if set(per_step.columns) & set(GRAPH_PHASES):
        text.append("rollout_graph is a whole rollout as one call (graph_scope rollout or both: the env's steps, "
                    "the policy's and the copies between them), update_graph a whole update (advantages, every "
                    "minibatch's forward, loss, backward and optimizer step): inside one call the phases are not "
                    "timed apart, and `rlperf profile` splits a traced epoch's kernels by the call that ran them "
                    "(`kernels_by_phase`).")
    return Section("Phase breakdown", text, [shown], [figures.phase_breakdown(per_step)])


def which_side_waits(env_us: float, waited_us: float, policy_us: float, step_us: float, env_groups: int,
                     reference: bool = True) -> str:
    """One point's line: the env's share of the step, how much of it the env groups' overlap hid behind the
    policy (and how much of the policy's time that was), and the side that limits the rollout, whose hardware
    would speed it. With one group, the most that overlapping could hide: the smaller side's share, which is
    all a user needs to see whether groups (whose own launches and copies cost on a GPU) are worth trying."""
    if np.isnan(env_us):
        return "not measured"
    beside = max(0.0, env_us - waited_us)
    text = f"env {env_us / step_us:.0%} of the step, "
    text += f"{beside / env_us if env_us else 0.0:.0%} of it hidden behind the policy" if env_groups > 1 \
        else "none of it hidden (one env group)"
    if np.isnan(policy_us):
        return text + "; the policy was not timed (timers off)"
    if env_groups > 1 and policy_us:
        text += f" ({min(1.0, beside / policy_us):.0%} of the policy's time)"
    text += f", policy {policy_us / step_us:.0%}: "
    if env_us > policy_us:
        text += "the env side limits the rollout, more cores or env threads would speed it"
    else:
        text += "the policy side limits the rollout, a faster device would speed it"
    if env_groups > 1 or not reference:  # env groups are the reference trainer's knob
        return text
    return text + f"; --env-groups 2 could hide at most {min(env_us, policy_us) / step_us:.0%} of the step"


def env_overlap_section(run: RunData) -> Section | None:
    if run.samples.empty:
        return None
    per_step = env_overlap_per_step(run)
    rows = [{"point": label, "env (µs/step)": _fmt_us(row.env), "trainer waited (µs/step)": _fmt_us(row.waited),
             "policy (µs/step)": _fmt_us(row.policy), "which side waits": which_side_waits(
                 row.env, row.waited, row.policy, row.step, int(row.env_groups), bool(row.reference)),
             "env start-up s": _fmt_start(row.start, row.build)}
            for label, row in per_step.iterrows()]
    text = ["Per agent step over the steady epochs (median of repeats): the env's own time, measured where it "
            "steps (a native env from its actions sent to its results ready, a worker thread's step, else the step "
            "in the trainer's thread; groups stepping at once count once); the time "
            "the trainer's thread spent on it (starting its steps and waiting for them); the policy's time (the "
            "rollout's eval phases). With two or more env groups the env steps beside the next group's policy, "
            "so env minus waited is what the overlap hid, and the larger of env and policy limits the rollout. "
            "The env's start-up (before the first epoch, in the warm-up) is its building, then its first reset: "
            "--env-workers divides the building of an env that builds its copies one after the other (ale-py), "
            "--env-threads its reset."]
    return Section("Which side waits", text, [pd.DataFrame(rows)])


def _fmt_us(us: float) -> str:
    return "not measured" if np.isnan(us) else f"{us:.2f}"


def _fmt_start(start: float, build: float) -> str:
    if np.isnan(start):
        return "not measured"
    return f"{start:.2f}" if np.isnan(build) else f"{start:.2f} ({build:.2f} building)"


def fmt_phase_changes(changes: list) -> str:
    return ", ".join(f"{phase} {(change.candidate - change.baseline) * 1e6:+.2f} µs ({fmt_change(change.relative)})"
                     for phase, change in changes)


KNOB_OUTCOMES = {"improved": "faster", "regressed": "slower", "unchanged": "no clear change",
                 "inconclusive": "can't tell"}


def knob_section(run: RunData, threshold: float, alpha: float) -> Section | None:
    rows = []
    for knobs, reference, mine, theirs in knob_pairs(run):
        verdict = judge_point(mine, theirs, threshold, alpha)
        sps, grew, shrank = verdict.sps, verdict.phases_grew, verdict.phases_shrank
        if sps is None:
            continue
        # as for growth, a saving under 2% of the step explains nothing
        shrank = [(phase, change) for phase, change in shrank
                  if change.baseline - change.candidate >= MIN_PHASE_GROWTH_SHARE / sps.baseline]
        rows.append({
            "knobs": knobs, "compared with": point_label(reference),
            "SPS": f"{fmt_sps(sps.baseline)} → {fmt_sps(sps.candidate)}",
            "change": f"{fmt_change(sps.relative)} {fmt_interval(sps)}",
            "verdict": KNOB_OUTCOMES[verdict.status], "p": fmt_p(sps.p_value), "phases that shrank (per step)": fmt_phase_changes(shrank),
            "phases that grew (per step)": fmt_phase_changes(grew),
        })
    if not rows:
        return None
    text = [f"Each point is compared with the point of this run that sets only some of its values and nothing "
            f"else (for a knob swept alone: the baseline at the same batch size), by the same rule as regressions "
            f"(faster or slower: the {1 - alpha:.0%} interval of the change excludes no change and the estimate "
            f"lies beyond ±{threshold:.0%}; no clear change: the interval lies within ±{threshold:.0%}; can't "
            f"tell: neither). The phases show where a knob saved or cost time, in microseconds per agent step."]
    return Section("What each knob changed", text, [pd.DataFrame(rows)])


def _medians_by_point(table: pd.DataFrame) -> dict[str, float]:
    return dict(zip(table["point_key"], table["sps_median"]))


def axes_section(run: RunData, table: pd.DataFrame) -> Section | None:
    axes = swept_axes(run)
    medians = _medians_by_point(table)
    svgs = []
    # world_size gets its own section, with the ideal line and scaling efficiency
    for axis in [name for name in axes if name != "world_size"]:
        lines: dict[str, list] = {}
        for point_key, sps in medians.items():
            values = json.loads(point_key)
            if axis not in values or not np.isfinite(sps):
                continue
            others = point_label({k: v for k, v in values.items() if k != axis and k in axes})
            lines.setdefault(others, []).append({"x": values[axis], "sps": sps})
        frames = {label: pd.DataFrame(rows).sort_values("x") if _sortable(rows) else pd.DataFrame(rows)
                  for label, rows in lines.items() if rows}
        if frames:
            svgs.append(figures.sps_along_axis(axis, frames))
    if not svgs:
        return None
    return Section("SPS along each swept axis", ["One line per combination of the other swept values."],
                   figures=svgs, in_markdown=False, side_by_side=True)


def _sortable(rows: list[dict]) -> bool:
    kinds = {type(row["x"]) for row in rows}
    return kinds <= {int, float} or len(kinds) == 1


def scaling_section(run: RunData, table: pd.DataFrame) -> Section | None:
    if "world_size" not in swept_axes(run):
        return None
    groups: dict[str, list] = {}
    for point_key, sps in _medians_by_point(table).items():
        values = json.loads(point_key)
        if "world_size" not in values or not np.isfinite(sps):
            continue
        others = point_label({k: v for k, v in values.items() if k != "world_size"})
        groups.setdefault(others, []).append({"world_size": int(values["world_size"]), "sps": sps})
    rows, frames = [], {}
    for label, entries in groups.items():
        frame = pd.DataFrame(entries).sort_values("world_size")
        frames[label] = frame
        one_rank = frame.loc[frame["world_size"] == 1, "sps"]
        for entry in frame.itertuples():
            efficiency = entry.sps / (entry.world_size * one_rank.iloc[0]) if not one_rank.empty else np.nan
            rows.append({"other settings": label or "–", "world size": entry.world_size, "SPS": fmt_sps(entry.sps),
                         "SPS per rank": fmt_sps(entry.sps / entry.world_size),
                         "scaling efficiency": f"{efficiency:.0%}" if np.isfinite(efficiency) else "–"})
    text = ["Scaling efficiency is SPS_n / (n × SPS_1): 100% means n ranks ran n times as fast as one."]
    return Section("Scaling with world size", text, [pd.DataFrame(rows)], [figures.scaling(frames)],
                   side_by_side=True)


def ranks_section(run: RunData) -> Section | None:
    rows = []
    for point_key, samples in run.samples.groupby("point_key", sort=False):
        per_rank: dict[int, list[dict]] = {}
        for summary in samples["summary"]:
            if summary.world_size > 1:
                for rank in summary.ranks or []:
                    per_rank.setdefault(rank["rank"], []).append(rank["phases"])
        if not per_rank:
            continue
        medians = pd.DataFrame({rank: pd.DataFrame(phases).median() for rank, phases in per_rank.items()})
        for phase, seconds in medians.iterrows():
            slow, fast = seconds.idxmax(), seconds.idxmin()
            spread = seconds[slow] / seconds[fast] - 1 if seconds[fast] > 0 else np.nan
            rows.append({"point": point_label(point_key), "phase": phase,
                         "slowest rank": f"{slow} ({seconds[slow]:.3f} s)",
                         "fastest rank": f"{fast} ({seconds[fast]:.3f} s)",
                         "spread": f"{spread:+.0%}" if np.isfinite(spread) else "–"})
    if not rows:
        return None
    text = ["Per-rank phase seconds over the steady epochs (median of repeats): a rank much slower than the "
            "others in one phase is a straggler that every collective waits for."]
    return Section("Per-rank stragglers", text, [pd.DataFrame(rows)])


def utilization_section(run: RunData) -> Section | None:
    series = run.utilization
    if series.empty:
        return None
    first = series[series["repeat"] == series.groupby("point_key")["repeat"].transform("min")]
    first = first.assign(label=first["point_key"].map(point_label),
                         t_s=(first["t_ns"] - first.groupby("point_key")["t_ns"].transform("min")) / 1e9)
    metrics = [m for m in UTILIZATION_METRICS if m in set(first["metric"])]
    if not metrics:
        return None
    summary = (series[series["metric"].isin(metrics)]
               .groupby(["point_key", "source", "metric"], sort=False)["value"]
               .agg(["mean", "max"]).reset_index())
    shown = pd.DataFrame({"point": summary["point_key"].map(point_label), "source": summary["source"],
                          "metric": summary["metric"], "mean": summary["mean"].map(lambda v: f"{v:,.1f}"),
                          "max": summary["max"].map(lambda v: f"{v:,.1f}")})
    text = ["NVML's GPU utilization is the share of time any kernel ran, not how busy the GPU was: read it "
            "next to SPS."]
    return Section("Utilization over time", text, [shown], [figures.utilization(first, metrics)])


def gpu_clocks_section(run: RunData) -> Section | None:
    """Per repeat on a GPU, its SPS beside the SM clock, the clock-event reasons and the temperature NVML read
    while it ran: a GPU left idle between small kernels lowers its clock, so a slow repeat may have run slow."""
    series = run.utilization
    if series.empty:
        return None
    gpu = series[series["source"].str.startswith("gpu:") & series["metric"].isin(CLOCK_METRICS)]
    if gpu.empty:
        return None
    sps = {(row.point_key, row.repeat): row.sps for row in run.samples.itertuples()}
    several = gpu["source"].nunique() > 1
    rows = []
    for (point_key, repeat, source), group in gpu.groupby(["point_key", "repeat", "source"], sort=False):
        values = {metric: found["value"].dropna() for metric, found in group.groupby("metric")}
        clock, reasons, heat = (values.get(metric, pd.Series(dtype=float)) for metric in CLOCK_METRICS)
        row = {"point": point_label(point_key), "repeat": repeat}
        if several:
            row["GPU"] = source.removeprefix("gpu:")[-8:]
        row["SPS"] = fmt_sps(sps.get((point_key, repeat)))
        row["SM clock, MHz (mean, min–max)"] = (f"{clock.mean():,.0f} ({clock.min():,.0f}–{clock.max():,.0f})"
                                                if len(clock) else "–")
        row["clock events (share of samples)"] = ", ".join(
            f"{name} {share:.0%}" for name, share in clock_event_shares(reasons.astype(int)).items()) or "none"
        row["temperature, °C (mean / max)"] = f"{heat.mean():.0f} / {heat.max():.0f}" if len(heat) else "–"
        rows.append(row)
    text = ["Per repeat: NVML's SM clock, the reasons it gave for a clock below the maximum ('idle': no work "
            "queued; 'power cap', 'thermal', 'hardware slowdown': the GPU held back), and the temperature, sampled "
            "while the repeat ran. Repeats of one point that differ in SPS and in clock point at the GPU's clock "
            "rather than the code."]
    return Section("GPU clocks per repeat", text, [pd.DataFrame(rows)])


def clock_event_shares(masks: pd.Series) -> dict[str, float]:
    """Each clock-event reason's share of the samples that named it, in NVML's bit order."""
    shares = {name: float(((masks & bit) != 0).mean()) for bit, name in CLOCK_EVENT_REASONS.items()}
    shares["other bits"] = float(((masks & ~sum(CLOCK_EVENT_REASONS)) != 0).mean())
    return {name: share for name, share in shares.items() if share > 0}


def collectives_section(run: RunData) -> Section | None:
    rows = run.collectives
    if rows.empty:
        return None
    rows = rows.astype({"algbw_gbps": float, "busbw_gbps": float})  # NULL (a call timed at zero): NaN, left out
    table = (rows.groupby(["op", "backend", "world_size", "bytes"], sort=True)
             .agg(time_us=("time_us", "median"), algbw_gbps=("algbw_gbps", "median"),
                  busbw_gbps=("busbw_gbps", "median")).reset_index())
    shown = pd.DataFrame({"op": table["op"], "backend": table["backend"], "ranks": table["world_size"],
                          "bytes": table["bytes"].map(lambda b: f"{b:,}"),
                          "time µs": table["time_us"].map(lambda v: f"{v:,.1f}"),
                          "algbw GB/s": table["algbw_gbps"].map(lambda v: "–" if pd.isna(v) else f"{v:.2f}"),
                          "busbw GB/s": table["busbw_gbps"].map(lambda v: "–" if pd.isna(v) else f"{v:.2f}")})
    text = ["algbw = bytes / time; busbw follows the nccl-tests convention (all-reduce × 2(n−1)/n, all-gather "
            "and reduce-scatter × (n−1)/n); medians over repeats."]
    return Section("Collectives", text, [shown], [figures.collectives(rows)], side_by_side=True)


def traces_section(run: RunData) -> Section | None:
    """Key figures of each profiled point's trace summary (profilers/trace_summary.py)."""
    if run.traces.empty:
        return None
    rows = []
    for trace in run.traces.itertuples():
        found = (trace.summary or {}).get("trace_summary") or {}
        gpu = found.get("gpu") or {}
        rows.append({
            "point": point_label(trace.point_key), "kind": found.get("kind", "–"),
            "MiB": f"{found['bytes'] / 2**20:.1f}" if found.get("bytes") else "–",
            "CPU ops per env step": _fmt_optional(found.get("cpu_ops_per_env_step")),
            "launches per env step": _fmt_optional(found.get("launches_per_env_step")),
            "host syncs per epoch": _fmt_optional(found.get("host_syncs_per_epoch")),
            "GPU busy": f"{gpu['busy_fraction']:.0%}" if gpu.get("busy_fraction") is not None else "–",
            "top operators": ", ".join(op["name"] for op in (found.get("top_operators") or [])[:3]),
            "trace file": trace.path,
        })
    return Section("Traces", [PROFILED_NOTE], [pd.DataFrame(rows)])


def _fmt_optional(value) -> str:
    return "–" if value is None else f"{value:.3g}"


def build(candidate: RunData, baseline: RunData | None = None, threshold: float = DEFAULT_THRESHOLD,
          alpha: float = DEFAULT_ALPHA) -> tuple[Report, list[PointVerdict], list[LearningVerdict]]:
    table = point_table(candidate)
    verdicts: list[PointVerdict] = []
    learning_verdicts: list[LearningVerdict] = []
    sections: list[Section | None] = []
    gate_plan = screening.screen_pair_plan(candidate, baseline) if baseline is not None else None
    if gate_plan is not None:
        found = screening.stored_verdicts(candidate, baseline, gate_plan)
        verdicts = screening.as_point_verdicts(found)
        speed_section = gate_section(found, gate_plan, baseline)
    elif baseline is not None:
        design = paired_design(candidate.fingerprint, baseline.run_id) \
            if candidate.store_path == baseline.store_path else None
        if design is not None:
            verdicts = judge_pairs(candidate.points, candidate.samples, baseline.points, baseline.samples, design)
        else:
            verdicts = judge(candidate.points, candidate.samples, baseline.points, baseline.samples, threshold,
                             alpha)
        speed_section = verdict_section(verdicts, candidate, baseline, threshold, alpha, design)
    if baseline is not None:
        # a point that got faster but learns worse is said first
        learning, learning_verdicts = baseline_learning_section(candidate, baseline, verdicts, alpha)
        sections += [learning, speed_section, memory.baseline_section(point_table(baseline), table)]
    if not table.empty:
        sections += [sps_section(table), learning_section(candidate, table, alpha),
                     knob_learning_section(candidate, threshold, alpha), quiet_section(candidate),
                     phase_section(candidate), env_overlap_section(candidate), roofline.section(candidate), knob_section(candidate, threshold, alpha),
                     axes_section(candidate, table), memory.section(candidate, table),
                     scaling_section(candidate, table), ranks_section(candidate), utilization_section(candidate),
                     gpu_clocks_section(candidate)]
    sections += [collectives_section(candidate), traces_section(candidate), fingerprint_section(candidate)]
    badges = {status: count for status, count in tally(verdicts).items() if count}
    report = Report(f"rlperf report · suite {candidate.suite}", run_header(candidate),
                    [s for s in sections if s is not None], badges)
    return report, verdicts, learning_verdicts


def render(candidate: RunData, out_dir: str, baseline: RunData | None = None,
           threshold: float = DEFAULT_THRESHOLD, alpha: float = DEFAULT_ALPHA, allow_cross_machine: bool = False,
           fail_on_inconclusive: bool = False) -> tuple[int, list[PointVerdict], tuple[str, str]]:
    """Writes report.md and report.html for one run into `out_dir`. The status is 1 when a point regressed
    against `baseline` (in SPS, or in time to solve), or could not be decided and `fail_on_inconclusive`, else
    0; bad input raises BadInput. Returns the status, the SPS verdicts and the two paths."""
    check_criteria(threshold, alpha)
    if baseline is not None:
        check_baseline(candidate, baseline, allow_cross_machine)
    report, verdicts, learning_verdicts = build(candidate, baseline, threshold, alpha)
    paths = write_report(report, out_dir)
    # learning verdicts have the SPS verdicts' outcomes, and fail a run the same way
    status = max(exit_code(verdicts, fail_on_inconclusive), exit_code(learning_verdicts, fail_on_inconclusive))
    return status, verdicts, paths
