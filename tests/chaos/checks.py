"""Every rule of the design (docs/explanation/design.md), checked for every saga against the
database itself.

``observe`` reads the disposable database once (registers, the simulated systems' effects and
idempotency records, dead letters, blocks); ``verify`` is pure and returns every violation with
the saga, the order and the evidence. The register is read as plain JSON, not through the
production models, so a check never depends on the code it checks.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from tests.chaos.load import Expectation, Load, PlannedSaga, expect

FINAL = frozenset({"completed", "compensated", "needs_human"})
# What a compensation leaves behind in each simulated system, by forward action.
UNDONE = {
    "inventory.reserve_stock": "released",
    "erp.create_credit_note": "voided",
    "payments.charge_card": "refunded",
}
RESULT_ID = {
    "inventory.reserve_stock": "reservation_id",
    "erp.create_credit_note": "credit_note_id",
    "payments.charge_card": "payment_id",
    "email.send_customer_email": "email_id",
    "email.send_confirmation": "email_id",
}
IRREVERSIBLE = frozenset({"email.send_customer_email", "email.send_confirmation"})
# The wording the machine uses when a deadline gives up on a step (no answer after N sends):
# allowed by design, reported apart from faults so it is visible.
DEADLINE_WORDS = "no answer after"
# A crash used up a send's attempts (saga_services.calls): like a deadline, the faults then decide
# less than the crash did.
SPENT_WORDS = "the attempts of"


# --- what the database holds ---------------------------------------------------------------------


@dataclass(frozen=True)
class StepRecord:
    index: int
    action: str
    action_class: str
    status: str
    effect_unknown: bool
    started_at: datetime | None
    finished_at: datetime | None
    landed_seq: int | None
    compensation: str | None
    compensation_status: str
    compensated_at: datetime | None
    result: dict[str, Any]
    error: str | None
    compensation_error: str | None

    @property
    def may_have_landed(self) -> bool:
        return self.status in ("done", "compensated", "compensation_failed") or (
            self.status == "failed" and self.effect_unknown
        )

    @property
    def compensable(self) -> bool:
        return self.action_class in ("compensable", "compensable_with_residue")


@dataclass(frozen=True)
class SagaRecord:
    saga_id: str
    order_id: str
    kind: str
    status: str
    arrival: int
    finished_at: datetime | None
    waiting_for: str | None
    reason: str | None
    needs_human_reason: str | None
    steps: tuple[StepRecord, ...]

    @property
    def first_started(self) -> datetime | None:
        started = [s.started_at for s in self.steps if s.started_at is not None]
        return min(started) if started else None


@dataclass(frozen=True)
class Effect:
    action: str
    order_id: str
    key: str
    entity_id: str
    applied_at: datetime


@dataclass
class Observed:
    sagas: dict[str, SagaRecord]
    effects: list[Effect]
    # idempotency key -> (outcome, created_at), as the simulated systems stored it
    idempotency: dict[str, tuple[str, datetime]]
    entity_status: dict[str, str]  # reservation/credit note/charge id -> status; e-mail -> "sent"
    dead_letters: list[dict[str, Any]]
    blocks: list[dict[str, Any]]
    parked: list[dict[str, Any]]
    rejections: list[dict[str, Any]]
    outbox_left: int
    # From saga_log: messages applied more than once, and per-order handling numbers given to
    # two messages or skipped (each would mean two coordinators interleaved one order).
    applied_twice: list[dict[str, Any]] = field(default_factory=list)
    seq_clashes: list[dict[str, Any]] = field(default_factory=list)
    # How hard the recovery machinery worked (duplicates absorbed, deadlines fired, resends).
    handling: dict[str, int] = field(default_factory=dict)
    # order -> the saga holding it (``orders.active_saga_id``). A waiting saga's own
    # ``waiting_for`` names the holder when it arrived, which may have ended since.
    holders: dict[str, str] = field(default_factory=dict)
    _keys_by_saga: dict[str, list[str]] | None = None

    def keys_of(self, saga_id: str) -> list[str]:
        """The idempotency keys of one saga (``saga_id:action...``), indexed on first use."""
        if self._keys_by_saga is None:
            index: dict[str, list[str]] = defaultdict(list)
            for key in self.idempotency:
                index[key.split(":", 1)[0]].append(key)
            self._keys_by_saga = index
        return self._keys_by_saga.get(saga_id, [])


def _ts(value: Any) -> datetime | None:
    return None if value in (None, "") else datetime.fromisoformat(str(value))


def _step(raw: dict[str, Any]) -> StepRecord:
    return StepRecord(
        index=int(raw["index"]),
        action=str(raw["action"]),
        action_class=str(raw.get("class", "")),
        status=str(raw.get("status", "")),
        effect_unknown=bool(raw.get("effect_unknown", False)),
        started_at=_ts(raw.get("started_at")),
        finished_at=_ts(raw.get("finished_at")),
        landed_seq=raw.get("landed_seq"),
        compensation=raw.get("compensation"),
        compensation_status=str(raw.get("compensation_status", "none")),
        compensated_at=_ts(raw.get("compensated_at")),
        result=dict(raw.get("result") or {}),
        error=raw.get("error"),
        compensation_error=raw.get("compensation_error"),
    )


def saga_record(row: asyncpg.Record) -> SagaRecord:
    state = json.loads(row["state"])
    return SagaRecord(
        saga_id=row["saga_id"],
        order_id=row["order_id"],
        kind=row["saga"],
        status=row["status"],
        arrival=row["arrival"],
        finished_at=_ts(state.get("finished_at")),
        waiting_for=state.get("waiting_for"),
        reason=state.get("reason"),
        needs_human_reason=state.get("needs_human_reason"),
        steps=tuple(_step(s) for s in state.get("steps", [])),
    )


async def observe(pool: asyncpg.Pool) -> Observed:
    # One snapshot for every query: a saga or an adapter committing between two of them would
    # otherwise show an entity without its effect, or an effect without its step.
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        sagas = await conn.fetch(
            "SELECT saga_id, order_id, saga, status, state::text AS state, arrival FROM sagas"
        )
        effects = await conn.fetch(
            "SELECT action, order_id, idempotency_key, entity_id, applied_at FROM sim_effects"
        )
        keys = await conn.fetch("SELECT key, outcome, created_at FROM service_keys")
        entities = await conn.fetch(
            "SELECT reservation_id AS id, status FROM sim_inventory_reservations"
            " UNION ALL SELECT credit_note_id, status FROM sim_erp_credit_notes"
            " UNION ALL SELECT payment_id, status FROM sim_payments_charges"
            " UNION ALL SELECT email_id, 'sent' FROM sim_email_messages"
        )
        dead = await conn.fetch(
            "SELECT id, message_type, order_id, saga_id, source_queue, reason, error,"
            " delivery_count, status FROM dead_letters ORDER BY id"
        )
        blocks = await conn.fetch("SELECT order_id, message_id, state, reason FROM order_blocks")
        parked = await conn.fetch("SELECT order_id, message_id, message_type, reason FROM parked")
        rejections = await conn.fetch(
            "SELECT saga_id, order_id, command_type, rule, reason FROM rejections"
        )
        outbox_left = await conn.fetchval("SELECT count(*) FROM outbox")
        applied_twice = await conn.fetch(
            "SELECT message_id, message_type, order_id, saga_id, count(*) AS n FROM saga_log"
            " WHERE seq IS NOT NULL GROUP BY 1, 2, 3, 4 HAVING count(*) > 1"
        )
        handling = await conn.fetchrow(_HANDLING_SQL)
        holders = await conn.fetch(
            "SELECT order_id, active_saga_id FROM orders WHERE active_saga_id IS NOT NULL"
        )
        seq_clashes = await conn.fetch(
            "SELECT order_id, count(*) AS applied, count(DISTINCT seq) AS numbers,"
            " max(seq) AS last FROM saga_log WHERE seq IS NOT NULL GROUP BY order_id"
            " HAVING count(DISTINCT seq) <> count(*) OR max(seq) <> count(*)"
        )
    return Observed(
        sagas={r["saga_id"]: saga_record(r) for r in sagas},
        effects=[
            Effect(
                r["action"], r["order_id"], r["idempotency_key"], r["entity_id"], r["applied_at"]
            )
            for r in effects
        ],
        idempotency={r["key"]: (r["outcome"], r["created_at"]) for r in keys},
        entity_status={r["id"]: r["status"] for r in entities},
        dead_letters=[dict(r) for r in dead],
        blocks=[dict(r) for r in blocks],
        parked=[dict(r) for r in parked],
        rejections=[dict(r) for r in rejections],
        outbox_left=int(outbox_left or 0),
        applied_twice=[dict(r) for r in applied_twice],
        seq_clashes=[dict(r) for r in seq_clashes],
        handling={k: int(v or 0) for k, v in dict(handling or {}).items()},
        holders={r["order_id"]: r["active_saga_id"] for r in holders},
    )


_HANDLING_SQL = """
SELECT count(*) FILTER (WHERE note = 'duplicate absorbed') AS duplicates_absorbed,
       count(*) FILTER (WHERE message_type = 'saga.deadline') AS deadlines_fired,
       count(*) FILTER (WHERE note LIKE '%sent again%') AS requests_resent,
       count(*) FILTER (WHERE note LIKE 'stale%') AS stale_messages,
       count(*) FILTER (WHERE note LIKE 'parked%') AS parked_messages
FROM saga_log
"""


# --- the verdict -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    rule: str
    what: str
    saga_id: str | None = None
    order_id: str | None = None

    def __str__(self) -> str:
        where = " ".join(x for x in (self.order_id, self.saga_id) if x)
        return f"[rule {self.rule}] {where}: {self.what}"


@dataclass
class Verdict:
    violations: list[Violation] = field(default_factory=list)
    terminal: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    duplicated_effects: int = 0
    dead_letters: int = 0
    held: int = 0  # sagas waiting behind a needs_human saga of their order, as rule 6 wants
    # Allowed by design but worth seeing: deadlines that gave up, sagas held behind needs_human.
    notes: list[str] = field(default_factory=list)
    handling: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


def verify(load: Load, seen: Observed, confirmed: set[str]) -> Verdict:
    """``confirmed``: the sagas whose start the broker confirmed; one never confirmed (the run
    gave up publishing it) may exist or not, but is checked like the others if it does."""
    verdict = Verdict(handling=dict(seen.handling))
    effects = _effects_by_saga(seen.effects)
    for saga in load.sagas:
        record = seen.sagas.get(saga.saga_id)
        if record is None:
            if saga.saga_id in confirmed:
                verdict.violations.append(_missing(saga, seen, verdict))
            continue
        verdict.terminal[record.status] += 1
        context = _SagaContext(saga, record, expect(saga, load), effects.get(saga.saga_id, []))
        for v in _check_saga(context, seen, verdict):
            verdict.violations.append(v)
    verdict.duplicated_effects = _check_once_per_key(seen, verdict)
    _check_orders(load, seen, verdict)
    _check_leftovers(load, seen, verdict)
    return verdict


def _missing(saga: PlannedSaga, seen: Observed, verdict: Verdict) -> Violation:
    """A confirmed start with no saga: parked (stuck, but kept) or lost without a trace."""
    parked = [p for p in seen.parked if p["message_id"] == saga.message_id]
    if parked:
        what = f"start confirmed, but no saga: the start is still parked ({parked[0]['reason']})"
        return Violation("1", what, saga.saga_id, saga.order_id)
    verdict.lost += 1
    return Violation(
        "1", "start confirmed, but no saga and no trace of it", saga.saga_id, saga.order_id
    )


def _effects_by_saga(effects: Iterable[Effect]) -> dict[str, list[Effect]]:
    grouped: dict[str, list[Effect]] = defaultdict(list)
    for effect in effects:
        grouped[effect.key.split(":", 1)[0]].append(effect)
    return grouped


@dataclass(frozen=True)
class _SagaContext:
    planned: PlannedSaga
    record: SagaRecord
    expected: Expectation
    effects: list[Effect]

    def forward_effects(self, action: str) -> list[Effect]:
        key = f"{self.record.saga_id}:{action}"
        return [e for e in self.effects if e.key == key]

    def v(self, rule: str, what: str) -> Violation:
        return Violation(rule, what, self.record.saga_id, self.record.order_id)


def _check_saga(ctx: _SagaContext, seen: Observed, verdict: Verdict) -> Iterator[Violation]:
    not_final = list(_check_final(ctx, seen, verdict))
    yield from not_final
    if ctx.record.status not in FINAL:
        return  # still moving: what it did so far is judged once it ends
    yield from _check_expected(ctx, verdict)
    yield from _check_register_matches_systems(ctx, seen)
    yield from _check_irreversible(ctx)
    yield from _check_compensation(ctx, seen)


# rule 1: exactly one terminal state, coherent with the steps


def _check_final(ctx: _SagaContext, seen: Observed, verdict: Verdict) -> Iterator[Violation]:
    r = ctx.record
    holder = _needs_human_holder(r, seen)
    if r.status == "waiting" and holder is not None:
        # Rule 6: a needs_human saga keeps its order; this one must not have started at all.
        if r.first_started is not None or ctx.effects:
            yield ctx.v("6", f"waits behind needs_human {holder}, yet it has run")
        verdict.held += 1
        return
    if r.status not in FINAL:
        steps = ", ".join(f"{s.action}={s.status}/{s.compensation_status}" for s in r.steps)
        yield ctx.v("1", f"not final: status {r.status} (steps: {steps})")
        return
    statuses = [s.status for s in r.steps]
    if r.status == "completed" and any(s != "done" for s in statuses):
        yield ctx.v("1", f"completed with steps {statuses}")
    if r.status != "completed" and any(s.status == "running" for s in r.steps):
        yield ctx.v("1", f"{r.status} with a step still running: {statuses}")
    if r.status == "needs_human":
        # One reason a person is needed: a compensation that failed, or a step in doubt.
        failed = [s.index for s in r.steps if s.compensation_status == "failed"]
        doubtful = [s.index for s in r.steps if s.status == "in_doubt"]
        if len(failed) + len(doubtful) != 1:
            yield ctx.v("5", f"needs_human with failed compensations at steps {failed} and "
                        f"steps in doubt {doubtful}")  # fmt: skip


def _found_not_landed(record: SagaRecord, index: int | None) -> bool:
    """The failing step's adapter found out its call never landed (a settle fenced the key)."""
    step = next((s for s in record.steps if s.index == index), None)
    return step is not None and step.status == "failed" and not step.effect_unknown


def _needs_human_holder(record: SagaRecord, seen: Observed) -> str | None:
    """The saga holding this one's order, when it is in needs_human."""
    holder = seen.sagas.get(seen.holders.get(record.order_id, ""))
    return holder.saga_id if holder is not None and holder.status == "needs_human" else None


def _check_expected(ctx: _SagaContext, verdict: Verdict) -> Iterator[Violation]:
    """The outcome the injected faults make certain (see ``load``)."""
    r, want = ctx.record, ctx.expected
    if r.status not in FINAL or want.allows(r.status):
        return
    if r.status == want.if_not_landed and _found_not_landed(r, want.failing_step):
        return
    gave_up = [
        s
        for s in r.steps
        if any(words in (s.error or "") or words in (s.compensation_error or "")
               for words in (DEADLINE_WORDS, SPENT_WORDS))
    ]  # fmt: skip
    if gave_up and want.outcome != "needs_human" and r.status != "completed":
        step = gave_up[0]
        verdict.notes.append(
            f"{r.saga_id}: expected {want.outcome}, got {r.status}: a deadline gave up on "
            f"step {step.index} {step.action} ({step.error or step.compensation_error})"
        )
        return
    why = r.needs_human_reason or r.reason or "-"
    wanted = " or ".join(sorted({want.outcome, *want.also}))
    yield ctx.v("1", f"expected {wanted} ({want.why}), got {r.status}: {why}")


# rule 3 (per saga side): what the register says landed is what the systems hold


def _check_register_matches_systems(ctx: _SagaContext, seen: Observed) -> Iterator[Violation]:
    for step in ctx.record.steps:
        if step.action not in RESULT_ID or step.status == "running":
            continue  # read-only (nothing to find), or still in flight
        found = [e.entity_id for e in ctx.forward_effects(step.action)]
        wanted = step.result.get(RESULT_ID[step.action])
        if wanted is not None:
            # The identifier came from the system's answer: exactly that entity landed.
            if found != [wanted]:
                yield ctx.v(
                    "3", f"step {step.index} {step.action}: register {wanted}, system {found}"
                )
            elif wanted not in seen.entity_status:
                yield ctx.v("3", f"step {step.index}: {wanted} is missing from its system")
        elif step.status == "done":
            yield ctx.v("3", f"step {step.index} {step.action} done without its identifier")
        elif not step.may_have_landed and found:
            # Failed for sure (a stored refusal), or never sent: nothing may have landed.
            yield ctx.v(
                "3",
                f"step {step.index} {step.action} is {step.status} with "
                f"effect_unknown=false, yet the system holds {found}",
            )


# rule 2: the irreversible action only after everything before it, never after a failure


def _check_irreversible(ctx: _SagaContext) -> Iterator[Violation]:
    r = ctx.record
    sent = [e for e in ctx.effects if e.action in IRREVERSIBLE]
    if r.status == "completed" and len(sent) != 1:
        yield ctx.v("2", f"completed with {len(sent)} e-mail(s) sent")
    in_doubt = any(s.action in IRREVERSIBLE and s.status == "in_doubt" for s in r.steps)
    if r.status != "completed" and sent and not (r.status == "needs_human" and in_doubt):
        # (a step in doubt waits for a person, who will find it sent: not a compensation)
        yield ctx.v("2", f"{r.status} but the e-mail was sent ({sent[0].entity_id})")
    for email in sent:
        before = _forward_before(r, email)
        late = [e for e in ctx.effects if e.action in before and e.applied_at > email.applied_at]
        if late:
            yield ctx.v("2", f"e-mail {email.entity_id} sent before {late[0].action} landed")


def _forward_before(record: SagaRecord, email: Effect) -> set[str]:
    actions = [s.action for s in record.steps]
    position = actions.index(email.action) if email.action in actions else len(actions)
    return set(actions[:position])


# rule 4: compensation for everything that may have landed, in reverse order, nothing else


def _check_compensation(ctx: _SagaContext, seen: Observed) -> Iterator[Violation]:
    r = ctx.record
    for step in r.steps:
        yield from _check_step_compensation(ctx, step, seen)
    if r.status == "compensated":
        yield from _check_reverse_order(ctx, seen)


def _compensation_keys(saga_id: str, step: StepRecord, seen: Observed) -> list[str]:
    if step.compensation is None:
        return []
    base = f"{saga_id}:{step.compensation}"
    return [k for k in seen.keys_of(saga_id) if k == base or k.startswith(f"{base}:resume-")]


def _check_step_compensation(
    ctx: _SagaContext, step: StepRecord, seen: Observed
) -> Iterator[Violation]:
    r = ctx.record
    attempted = _compensation_keys(r.saga_id, step, seen)
    landed = ctx.forward_effects(step.action)
    if not step.may_have_landed and step.status in ("failed", "pending", "skipped"):
        if attempted:
            yield ctx.v(
                "4",
                f"step {step.index} {step.action} certainly did not land ({step.status}"
                f", effect_unknown=false), yet its compensation ran: {attempted}",
            )
        return
    if r.status == "completed":
        if attempted:
            yield ctx.v("4", f"completed, yet compensation {attempted} ran")
        for effect in landed:
            if seen.entity_status.get(effect.entity_id) == UNDONE.get(step.action):
                yield ctx.v("4", f"completed, yet {effect.entity_id} is {UNDONE[step.action]}")
        return
    if not step.compensable or not step.may_have_landed:
        return
    undone = step.compensation_status == "compensated"
    if r.status == "compensated" and not undone:
        yield ctx.v(
            "4",
            f"compensated, but step {step.index} {step.action} may have landed and "
            f"its compensation is {step.compensation_status}",
        )
    if undone and not any(seen.idempotency[k][0] == "done" for k in attempted):
        yield ctx.v(
            "4",
            f"step {step.index}: register says compensated, the system has no "
            f"successful {step.compensation} ({attempted})",
        )
    for effect in landed:
        status = seen.entity_status.get(effect.entity_id)
        if undone and status != UNDONE.get(step.action):
            yield ctx.v(
                "4",
                f"step {step.index}: compensated in the register, but "
                f"{effect.entity_id} is {status}",
            )


def _check_reverse_order(ctx: _SagaContext, seen: Observed) -> Iterator[Violation]:
    """Register and systems must both show the undo in reverse order of landing."""
    done = [s for s in ctx.record.steps if s.compensation_status == "compensated"]
    by_time = sorted(done, key=lambda s: s.compensated_at or datetime.min)
    seqs = [s.landed_seq or 0 for s in by_time]
    if seqs != sorted(seqs, reverse=True):
        yield ctx.v("4", f"compensated in landing order {seqs}, not reversed")
    claimed = []
    for step in done:
        keys = _compensation_keys(ctx.record.saga_id, step, seen)
        if keys:
            claimed.append((min(seen.idempotency[k][1] for k in keys), step.index))
    order = [index for _, index in sorted(claimed)]
    if order != sorted(order, reverse=True):
        yield ctx.v("4", f"the systems ran the compensations of steps in order {order}")


# rule 3 (global): at most one effect per idempotency key


def _check_once_per_key(seen: Observed, verdict: Verdict) -> int:
    per_key = Counter(e.key for e in seen.effects)
    duplicated = {k: n for k, n in per_key.items() if n > 1}
    for key, n in sorted(duplicated.items())[:20]:
        entities = sorted({e.entity_id for e in seen.effects if e.key == key})
        verdict.violations.append(Violation("3", f"key {key} applied {n} times: {entities}"))
    tracked = {e.entity_id for e in seen.effects}
    for entity, status in seen.entity_status.items():
        if entity not in tracked:
            verdict.violations.append(
                Violation("3", f"{entity} ({status}) exists without any recorded effect")
            )
    return len(duplicated)


# rule 6: per order, in publish order, one saga at a time


def _check_orders(load: Load, seen: Observed, verdict: Verdict) -> None:
    for order_id, planned in load.orders.items():
        records = [seen.sagas[s.saga_id] for s in planned if s.saga_id in seen.sagas]
        arrival = [r.saga_id for r in sorted(records, key=lambda r: r.arrival)]
        published = [s.saga_id for s in planned if s.saga_id in seen.sagas]
        if arrival != published:
            verdict.violations.append(
                Violation(
                    "6", f"arrival order {arrival} != publish order {published}", None, order_id
                )
            )
        ran = sorted((r for r in records if r.first_started), key=lambda r: r.arrival)
        for earlier, later in itertools.pairwise(ran):
            began = later.first_started
            assert began is not None
            if earlier.finished_at is None or began < earlier.finished_at:
                verdict.violations.append(
                    Violation(
                        "6",
                        f"{later.saga_id} started at {began} while {earlier.saga_id} "
                        f"({earlier.status}) ran until {earlier.finished_at}",
                        later.saga_id,
                        order_id,
                    )
                )


# rules 7-9: nothing dead-lettered, blocked, parked or refused because of the chaos


def _check_leftovers(load: Load, seen: Observed, verdict: Verdict) -> None:
    verdict.dead_letters = len(seen.dead_letters)
    for dl in seen.dead_letters:
        verdict.violations.append(
            Violation(
                "7/8",
                f"dead letter {dl['id']} ({dl['message_type']} from {dl['source_queue']}, "
                f"{dl['reason']} after {dl['delivery_count']} deliveries): {dl['error']}",
                dl["saga_id"],
                dl["order_id"],
            )
        )
    for block in seen.blocks:
        verdict.violations.append(
            Violation(
                "7/8",
                f"order still blocked by {block['message_id']} ({block['state']}): "
                f"{block['reason']}",
                None,
                block["order_id"],
            )
        )
    for parked in seen.parked:
        verdict.violations.append(
            Violation(
                "7/8",
                f"{parked['message_type']} {parked['message_id']} still parked: {parked['reason']}",
                None,
                parked["order_id"],
            )
        )
    for row in seen.applied_twice:
        verdict.violations.append(
            Violation(
                "8",
                f"{row['message_type']} {row['message_id']} applied {row['n']} times "
                "(the inbox should absorb the duplicate)",
                row["saga_id"],
                row["order_id"],
            )
        )
    for row in seen.seq_clashes:
        verdict.violations.append(
            Violation(
                "6",
                f"{row['applied']} messages applied with {row['numbers']} distinct "
                f"handling numbers up to {row['last']}",
                None,
                row["order_id"],
            )
        )
    ours = {s.saga_id for s in load.sagas}
    for rejection in seen.rejections:
        # An abort the saga's end overtook is refused by design ("only a running saga...").
        late_abort = (
            rejection.get("command_type") == "saga.abort" and rejection["rule"] == "saga_state"
        )
        if rejection["saga_id"] in ours and not late_abort:
            verdict.violations.append(
                Violation(
                    "9",
                    f"a valid start was refused ({rejection['rule']}): {rejection['reason']}",
                    rejection["saga_id"],
                    rejection["order_id"],
                )
            )
