"""Per-owner quotas and fair share (issue 15, points 2 and 3), read from ``hpo_quotas``.

An owner's quota (``service.db.QuotaRow``; a limit that is ``None`` is not set) bounds:

* ``max_running_trials``: trial slots held at once (``hpo_trial_slots``, one per running
  trial of any of the owner's studies);
* ``max_gpus``: the sum of ``resources.gpus`` (times workers) over those trials;
* ``device_seconds_per_day`` and ``device_seconds_total``: device-seconds in the last 24 h
  (rolling) and ever. Use counts the finished trials (``hpo_usage_events``) and the time
  the running ones have held their slots so far.

A trial takes a slot before it starts (:class:`QuotaGate`, the ``hpo.gate.TrialGate`` of
the study's driver) in one transaction that first locks the study's row, then the owner's
quota row (PostgreSQL: ``SELECT ... FOR UPDATE``; SQLite: the study's no-op ``UPDATE`` has
taken the database's write lock), so two drivers of one owner never both take its last
slot. Over quota, the trial is not made: the study waits, RUNNING with ``waiting_for``
naming the limit, and its trials start as the owner's other work ends. A QUEUED study of
an owner who could not start one trial now is not started by the dispatcher (it stays
QUEUED, ``waiting_for`` set), so it holds no driver. Slots are given back as trials end; a
dead driver's are swept (:func:`sweep`), counting as used the time until the sweep.

Fair share (:func:`pick_fair`): of the queued studies that may start, the dispatcher starts
the one whose owner holds the fewest slots, then has used the fewest device-seconds in
the last 24 h, then has the fewest RUNNING studies (a study claimed a moment ago holds no
slot yet: without this, one round would start an owner's studies back to back), then the
oldest.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from hpo.gate import TrialResources
from hpo.spec import load_stored
from service.db import QuotaRow, Status, StudyRow, TrialSlotRow, UsageEventRow, utcnow

# the oldest QUEUED studies of each owner weighed by fair share in one round: per owner, so
# that one owner's many queued studies never hide another's (helper-39: the 500 oldest of
# all owners, one member's 505 cheap studies starved everyone else's, cluster idle)
QUEUED_PER_OWNER = 20
QUEUED_PER_OWNER_MAX = 200  # of all its sizes of trial

log = logging.getLogger(__name__)

WINDOW = dt.timedelta(hours=24)
LIMITS = ("max_running_trials", "max_gpus", "device_seconds_per_day", "device_seconds_total")


@dataclasses.dataclass(frozen=True)
class Limits:
    """An owner's limits; ``None``: not set."""

    max_running_trials: int | None = None
    max_gpus: float | None = None
    device_seconds_per_day: float | None = None
    device_seconds_total: float | None = None

    @classmethod
    def of(cls, row: QuotaRow | None) -> Limits:
        return cls() if row is None else cls(**{k: getattr(row, k) for k in LIMITS})

    @property
    def any(self) -> bool:
        return any(getattr(self, k) is not None for k in LIMITS)


@dataclasses.dataclass(frozen=True)
class Use:
    """What an owner holds and has used.

    Attributes:
        running_trials: slots held (running trials of all its studies).
        gpus: GPUs those trials hold.
        device_seconds_24h: device-seconds of trials that ended in the last 24 h, plus
            those the running trials have held so far.
        device_seconds_total: the same, ever.
    """

    running_trials: int = 0
    gpus: float = 0.0
    device_seconds_24h: float = 0.0
    device_seconds_total: float = 0.0


def refusal(limits: Limits, use: Use, gpus: float) -> str | None:
    """Why one more trial holding ``gpus`` GPUs may not start now; ``None`` if it may."""
    n = limits.max_running_trials
    if n is not None and use.running_trials >= n:
        return f"quota max_running_trials: {use.running_trials} of {n} trials running"
    g = limits.max_gpus
    if g is not None and gpus > 0 and use.gpus + gpus > g:
        return f"quota max_gpus: {use.gpus:g} of {g:g} GPUs held, a trial needs {gpus:g}"
    day = limits.device_seconds_per_day
    if day is not None and use.device_seconds_24h >= day:
        return (f"quota device_seconds_per_day: {use.device_seconds_24h:.0f} of {day:g} "
                f"used in the last 24 h")
    total = limits.device_seconds_total
    if total is not None and use.device_seconds_total >= total:
        return f"quota device_seconds_total: {use.device_seconds_total:.0f} of {total:g} used"
    return None


def limits_of(session: Session, owner_ids: Iterable[int | None], *,
              lock: bool = False) -> dict[int | None, Limits]:
    """The limits of each owner (no row, or no owner: none set). ``lock``: slot-taking for
    those owners is serialized until the transaction ends: PostgreSQL locks their quota rows
    as it reads them (``FOR UPDATE``); on SQLite the transaction must hold the database's
    write lock already (have written)."""
    ids = {o for o in owner_ids if o is not None}
    read = sa.select(QuotaRow).where(QuotaRow.owner_id.in_(ids))
    if lock and session.get_bind().dialect.name == "postgresql":
        read = read.with_for_update()
    rows = session.execute(read).scalars() if ids else []
    found = {row.owner_id: Limits.of(row) for row in rows}
    return {o: found.get(o, Limits()) for o in {*owner_ids}}


def use_of(session: Session, owner_ids: Iterable[int | None],
           now: dt.datetime | None = None) -> dict[int | None, Use]:
    """Each owner's use (:class:`Use`) at ``now``: three grouped statements."""
    now = now or utcnow()
    owners = set(owner_ids)
    if not owners:
        return {}
    known = [o for o in owners if o is not None]
    slot_owner = sa.or_(TrialSlotRow.owner_id.in_(known),
                        TrialSlotRow.owner_id.is_(None) if None in owners else sa.false())
    event_owner = sa.or_(UsageEventRow.owner_id.in_(known),
                         UsageEventRow.owner_id.is_(None) if None in owners else sa.false())
    slots = session.execute(sa.select(TrialSlotRow.owner_id, TrialSlotRow.gpus,
                                      TrialSlotRow.devices, TrialSlotRow.started_at)
                            .where(slot_owner)).all()
    ended = sa.case((UsageEventRow.ended_at >= now - WINDOW, UsageEventRow.device_seconds),
                    else_=0.0)
    events = {o: (day or 0.0, total or 0.0) for o, day, total in session.execute(
        sa.select(UsageEventRow.owner_id, sa.func.sum(ended),
                  sa.func.sum(UsageEventRow.device_seconds))
        .where(event_owner).group_by(UsageEventRow.owner_id))}
    return {owner: _use([s for s in slots if s.owner_id == owner],
                        *events.get(owner, (0.0, 0.0)), now) for owner in owners}


def _use(held: Sequence[Any], day: float, total: float, now: dt.datetime) -> Use:
    """The use of an owner holding the slots ``held`` (rows with ``gpus``, ``devices`` and
    ``started_at``), with ``day`` and ``total`` device-seconds of its ended trials."""
    running = sum(max(0.0, (now - s.started_at).total_seconds()) * s.devices for s in held)
    return Use(running_trials=len(held), gpus=sum(s.gpus for s in held),
               device_seconds_24h=float(day) + running,
               device_seconds_total=float(total) + running)


def acquire(session: Session, study_id: int, claim: str, trial: str,
            resources: TrialResources, now: dt.datetime | None = None) -> str | None:
    """Take a slot for trial ``trial`` of study ``study_id`` (claimed by ``claim``), in the
    session's transaction; the reason it may not start (nothing taken), or ``None``.

    Also sets the study's ``waiting_for`` to that reason (or clears it) when it changes.
    A study no longer RUNNING under ``claim`` gets no slot ("the study's claim was lost").
    Three statements where the owner has no limits (a trial of every study takes one, on
    its driver's event loop).
    """
    now = now or utcnow()
    # the study's row locked first (PostgreSQL: its row lock; SQLite: the write lock), so
    # that a requeue (mark_requeue) and this never cross: one sees the other's write
    row = session.execute(
        sa.update(StudyRow).where(StudyRow.id == study_id, StudyRow.claimed_by == claim,
                                  StudyRow.status == Status.RUNNING)
        .values(waiting_for=StudyRow.waiting_for)
        .returning(StudyRow.owner_id, StudyRow.waiting_for)).first()
    if row is None:
        return "the study's claim was lost"
    if row.waiting_for == REQUEUING:
        return REQUEUING
    limits = limits_of(session, [row.owner_id], lock=True)[row.owner_id]
    reason = None
    if limits.any:
        reason = refusal(limits, use_of(session, [row.owner_id], now)[row.owner_id],
                         resources.gpus)
    if reason is None:
        session.execute(sa.insert(TrialSlotRow).values(
            owner_id=row.owner_id, study_id=study_id, trial=trial, gpus=resources.gpus,
            devices=resources.devices, started_at=now))
    if reason != row.waiting_for:
        session.execute(sa.update(StudyRow).where(StudyRow.id == study_id)
                        .values(waiting_for=reason))
    return reason


REQUEUING = "requeued: it waits for its quota while another study may start"


def mark_requeue(session: Session, study_id: int) -> bool:
    """Mark the RUNNING study ``study_id`` as being requeued, if it holds no trial slot; True
    if marked. From then on :func:`acquire` gives it no slot, so the driver interrupted next
    has no trial to lose (a trial started between the two would end FAIL and run again)."""
    session.execute(sa.select(StudyRow.id).where(StudyRow.id == study_id).with_for_update())
    held = sa.select(TrialSlotRow.id).where(TrialSlotRow.study_id == study_id)
    marked = session.execute(sa.update(StudyRow).where(
        StudyRow.id == study_id, StudyRow.status == Status.RUNNING, ~held.exists())
        .values(waiting_for=REQUEUING))
    return marked.rowcount == 1


def release(session: Session, study_id: int, trial: str, device_seconds: float,
            now: dt.datetime | None = None) -> bool:
    """Give back trial ``trial``'s slot and record its ``device_seconds`` as used by its
    owner, ended at ``now``; False (nothing recorded) if it held none (swept already).
    Two statements."""
    owner = session.execute(sa.delete(TrialSlotRow).where(
        TrialSlotRow.study_id == study_id, TrialSlotRow.trial == trial)
        .returning(TrialSlotRow.owner_id)).first()
    if owner is None:
        return False
    session.execute(sa.insert(UsageEventRow).values(
        owner_id=owner.owner_id, ended_at=now or utcnow(),
        device_seconds=max(0.0, device_seconds)))
    return True


def sweep(session: Session, study_ids: Sequence[int] | None = None,
          now: dt.datetime | None = None) -> int:
    """Give back the slots of studies that no longer run (no longer RUNNING: ended,
    requeued, deleted), or of the studies ``study_ids`` (taken over from a driver that is
    gone), recording as used the time each slot was held until ``now``. Returns how many.

    One ``DELETE ... RETURNING``: a slot that its trial's own :func:`release` gives back
    meanwhile is recorded by one of the two only (a read, then a delete, counted it twice).
    """
    now = now or utcnow()
    where = (TrialSlotRow.study_id.in_(study_ids) if study_ids is not None else
             ~TrialSlotRow.study_id.in_(sa.select(StudyRow.id)
                                        .where(StudyRow.status == Status.RUNNING)))
    slots = session.execute(sa.delete(TrialSlotRow).where(where).returning(
        TrialSlotRow.owner_id, TrialSlotRow.devices, TrialSlotRow.started_at)).all()
    if slots:
        session.execute(sa.insert(UsageEventRow), [
            {"owner_id": slot.owner_id, "ended_at": now,
             "device_seconds": max(0.0, (now - slot.started_at).total_seconds()) * slot.devices}
            for slot in slots])
    return len(slots)


class QuotaGate:
    """The ``hpo.gate.TrialGate`` of one study's driver: its trials take their owner's
    slots (:func:`acquire`, :func:`release`), each call in its own transaction.

    Args:
        sessions: a session factory on the service's engine.
        study_id: the study's ``hpo_studies.id``.
        claim: the driver's claim on the study (a driver that lost it takes no slot).
    """

    def __init__(self, sessions: sessionmaker, study_id: int, claim: str) -> None:
        self.sessions, self.study_id, self.claim = sessions, study_id, claim

    def sweep_own(self) -> int:
        """Give back slots an earlier driver of the study left (it died holding them)."""
        with self.sessions.begin() as session:
            return sweep(session, [self.study_id])

    def acquire(self, trial_id: str, resources: TrialResources) -> bool:
        """Take a slot; False while over quota, and on a database error (the trial waits and
        is asked for again: an outage never fails the study)."""
        try:
            with self.sessions.begin() as session:
                reason = acquire(session, self.study_id, self.claim, trial_id, resources)
        except sa.exc.SQLAlchemyError as e:
            log.warning("trial %s waits: the quota could not be read: %s", trial_id, e)
            return False
        if reason is not None:
            log.debug("trial %s waits: %s", trial_id, reason)
        return reason is None

    def release(self, trial_id: str, device_seconds: float) -> None:
        """Give the slot back; on a database error it stays until the study's slots are
        swept (when it no longer runs, or the next driver of the study starts)."""
        try:
            with self.sessions.begin() as session:
                release(session, self.study_id, trial_id, device_seconds)
        except sa.exc.SQLAlchemyError as e:
            log.warning("trial %s: its quota slot could not be given back: %s", trial_id, e)

    def clear_waiting(self) -> None:
        """The study waits for nothing (its driver is ending)."""
        with self.sessions.begin() as session:
            session.execute(sa.update(StudyRow).where(StudyRow.id == self.study_id,
                                                      StudyRow.waiting_for.is_not(None))
                            .values(waiting_for=None))


def _gpus_of(spec: dict) -> float:
    try:
        return TrialResources.of(load_stored(spec).resources).gpus
    except Exception:  # noqa: BLE001 - a spec that no longer loads fails in its driver
        return 0.0


def queued_candidates(session: Session, *columns: sa.ColumnElement) -> list[sa.Row]:
    """The rows ``quotas.pick_fair`` weighs (``id``, ``owner_id``, ``created_at``,
    ``spec``, then ``columns``), oldest first: of each owner, the ``QUEUED_PER_OWNER``
    oldest QUEUED studies of each size of trial (``resources.gpus`` and ``workers``: a
    ``max_gpus`` quota refuses study by study, and an owner's oldest GPU studies must not
    hide its CPU study, helper-40), ``QUEUED_PER_OWNER_MAX`` at most of all sizes."""
    wanted = [StudyRow.id, StudyRow.owner_id, StudyRow.created_at, StudyRow.spec, *columns]
    order = (StudyRow.created_at, StudyRow.id)
    size = [StudyRow.spec[("resources", key)].as_string() for key in ("gpus", "workers")]
    ranked = sa.select(
        *wanted,
        sa.func.row_number().over(partition_by=[StudyRow.owner_id, *size], order_by=order)
        .label("rank_of_size")).where(StudyRow.status == Status.QUEUED).subquery()
    of_owner = sa.select(*[ranked.c[c.key] for c in wanted]).where(
        ranked.c.rank_of_size <= QUEUED_PER_OWNER).subquery()
    # the cap counts the rows kept, oldest first
    capped = sa.select(of_owner, sa.func.row_number().over(
        partition_by=of_owner.c.owner_id, order_by=(of_owner.c.created_at, of_owner.c.id))
        .label("kept")).subquery()
    return session.execute(
        sa.select(*[capped.c[c.key] for c in wanted])
        .where(capped.c.kept <= QUEUED_PER_OWNER_MAX)
        .order_by(capped.c.created_at, capped.c.id)).all()


def pick_fair(session: Session, candidates: Sequence[Any],
              now: dt.datetime | None = None) -> tuple[Any | None, dict[int, str | None]]:
    """The queued study to start next, and why each other candidate may not start now.

    Args:
        candidates: rows with ``id``, ``owner_id``, ``created_at`` and ``spec`` (QUEUED
            studies).

    Returns:
        The candidate of the owner holding the fewest slots, then with the fewest
        device-seconds in the last 24 h, then with the fewest RUNNING studies, then the
        oldest, among those whose owner may
        start one trial now (``None`` if none may); and ``{study id: reason}`` for the
        candidates that may not (``None`` for those that may).
    """
    now = now or utcnow()
    owners = {c.owner_id for c in candidates}
    limits, use = limits_of(session, owners), use_of(session, owners, now)
    studies = dict(session.execute(sa.select(StudyRow.owner_id, sa.func.count())
                                   .where(StudyRow.status == Status.RUNNING)
                                   .group_by(StudyRow.owner_id)).all())
    reasons: dict[int, str | None] = {}
    for c in candidates:
        lim = limits[c.owner_id]
        gpus = _gpus_of(c.spec) if lim.max_gpus is not None else 0.0
        reasons[c.id] = refusal(lim, use[c.owner_id], gpus) if lim.any else None
    free = [c for c in candidates if reasons[c.id] is None]
    if not free:
        return None, reasons
    best = min(free, key=lambda c: (use[c.owner_id].running_trials,
                                    use[c.owner_id].device_seconds_24h,
                                    studies.get(c.owner_id, 0), c.created_at, c.id))
    return best, reasons


@dataclasses.dataclass(frozen=True)
class OwnerQuota:
    """An owner's limits and current use (what a read of one of its studies shows)."""

    limits: Limits
    use: Use


def quota_of(session: Session, owner_id: int | None,
             now: dt.datetime | None = None) -> OwnerQuota:
    """The limits and use of ``owner_id`` (``None``: studies without owner; no limits), as
    :func:`limits_of` and :func:`use_of` give them, in one statement built once (every read
    of a study shows its owner's quota: three statements built per call were a fifth of a
    read's CPU under ``bench/load.py``)."""
    now = now or utcnow()
    rows = session.connection().execute(_quota_statement(owner_id is None),
                                        {"owner": owner_id, "since": now - WINDOW}).all()
    first = rows[0]
    limits = Limits.of(first if owner_id is not None and first.has_quota is not None
                       else None)
    return OwnerQuota(limits, _use([r for r in rows if r.started_at is not None],
                                   first.day or 0.0, first.total or 0.0, now))


@functools.cache
def _quota_statement(no_owner: bool) -> sa.Select:
    """One row per trial slot the owner (``:owner``, or none) holds, at least one, each with
    its quota's limits and its device-seconds ended since ``:since`` and ever."""
    def owner_is(column):
        return column.is_(None) if no_owner else column == sa.bindparam("owner")

    one = sa.select(sa.literal(1).label("one")).subquery("one")
    ended = sa.case((UsageEventRow.ended_at >= sa.bindparam("since"),
                     UsageEventRow.device_seconds), else_=0.0)
    events = sa.select(sa.func.sum(ended).label("day"),
                       sa.func.sum(UsageEventRow.device_seconds).label("total")) \
        .where(owner_is(UsageEventRow.owner_id)).subquery("events")
    return (sa.select(QuotaRow.owner_id.label("has_quota"),
                      *(getattr(QuotaRow, k) for k in LIMITS), events.c.day, events.c.total,
                      TrialSlotRow.gpus, TrialSlotRow.devices, TrialSlotRow.started_at)
            .select_from(one)
            .outerjoin(QuotaRow, owner_is(QuotaRow.owner_id))
            .outerjoin(events, sa.true())
            .outerjoin(TrialSlotRow, owner_is(TrialSlotRow.owner_id)))


def owners_report(session: Session, now: dt.datetime | None = None
                  ) -> dict[str, OwnerQuota]:
    """By owner name (``(none)``: studies without owner): the limits and use of every owner
    that has a quota, holds a slot or used device-seconds in the last 24 h (for
    ``service.metrics``)."""
    from service.db import TokenRow

    now = now or utcnow()
    ids = set(session.execute(sa.select(QuotaRow.owner_id)).scalars())
    ids |= set(session.execute(sa.select(TrialSlotRow.owner_id).distinct()).scalars())
    ids |= set(session.execute(sa.select(UsageEventRow.owner_id).distinct()
                               .where(UsageEventRow.ended_at >= now - WINDOW)).scalars())
    if not ids:
        return {}
    names = dict(session.execute(sa.select(TokenRow.id, TokenRow.name)
                                 .where(TokenRow.id.in_([i for i in ids if i is not None]))
                                 ).all())
    limits, use = limits_of(session, ids), use_of(session, ids, now)
    return {names.get(o, "(none)") if o is not None else "(none)": OwnerQuota(limits[o], use[o])
            for o in ids}
