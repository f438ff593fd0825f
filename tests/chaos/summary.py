"""The chaos run's summary: what was done to the system, and what the checks found."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from tests.chaos.checks import Verdict
from tests.chaos.processes import ProcessExit

if TYPE_CHECKING:
    from tests.chaos.harness import ChaosResult


def summarize(result: ChaosResult) -> str:
    v = result.verdict
    kills = ", ".join(f"{k} {n}" for k, n in sorted(result.kills.items())) or "none"
    terminal = ", ".join(f"{k} {n}" for k, n in sorted(v.terminal.items())) or "none"
    graceful = [n for n, ok in sorted(result.graceful_stop.items()) if not ok]
    frozen = ", ".join(f"{name} for {s:.0f}s" for name, s in result.frozen_s.items())
    lines = [
        "=" * 78,
        f"CHAOS SUMMARY  ({'PASS' if result.ok else 'FAIL'})   seed {result.seed}",
        f"run directory        {result.workdir}",
        f"sagas                {result.config.sagas} over {result.orders} orders"
        + (", two `saga run all` with the in-process hand-off" if result.config.embedded else ""),
        f"kills (SIGKILL)      {sum(result.kills.values())}: {kills}",
        f"frozen (SIGSTOP)     {frozen or 'none'}",
        f"broker restarts      {result.broker_restarts}",
        f"database restarts    {result.db_restarts}" + _fail_over(result),
        f"terminal states      {terminal}"
        + (f" ({v.held} waiting behind a needs_human saga of their order)" if v.held else ""),
        f"settled in time      {'yes' if result.settled else 'NO'}",
        f"lost                 {v.lost}",
        f"duplicated effects   {v.duplicated_effects}",
        f"dead letters         {v.dead_letters}",
        f"rule violations      {len(v.violations)}",
        f"duration             {result.duration_s:.1f}s ({result.sagas_per_s:.1f} sagas/s, "
        "first publish to all settled)",
        f"agent publishes      {result.publish.confirmed} confirmed, {result.publish.retries} "
        f"re-sent, {result.publish.reconnects} new connections, errors {result.publish.errors}",
        f"operators' commands  {result.publish.aborts} aborts (during the chaos), "
        f"{result.publish.resumes} resumes (after it)",
        f"recovery at work     {_handling(v.handling)}",
        f"process exits        {len(result.process_exits)} not caused by the harness",
        "graceful stop        "
        + (f"NOT within 15s after SIGTERM: {graceful}" if graceful else "all exited on SIGTERM"),
    ]
    lines += violation_lines(v)
    lines += _exit_lines(result.process_exits)
    if v.notes:
        lines.append(f"notes ({len(v.notes)}, allowed by design):")
        lines += [f"  {n}" for n in v.notes[:10]]
    lines.append("=" * 78)
    return "\n".join(lines)


def _fail_over(result: ChaosResult) -> str:
    promote_s = result.promote_s
    return "" if promote_s is None else f", and a fail-over (standby promoted in {promote_s:.1f}s)"


def _handling(counts: dict[str, int]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in counts.items()) or "-"


def violation_lines(verdict: Verdict) -> list[str]:
    if not verdict.violations:
        return []
    by_rule = Counter(x.rule for x in verdict.violations)
    lines = [f"violations by rule   {dict(sorted(by_rule.items()))}", "first violations:"]
    lines += [f"  {x}" for x in verdict.violations[:15]]
    return lines


def _exit_lines(exits: list[ProcessExit]) -> list[str]:
    lines = []
    for e in exits[:5]:
        last = e.log_tail.strip().splitlines()[-1:] or ["(no output)"]
        lines.append(
            f"  exit: {e.name} code {e.returncode} at {e.at:.1f}s after {e.uptime_s:.1f}s up:"
            f" {last[0][:200]}"
        )
    return lines


# --- a kept run, checked again ---------------------------------------------------------------
