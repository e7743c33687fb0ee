"""The review node's first part: pending calls prepared, and the request the reviewer is shown.

Moved out of ``graph/_review.py`` (issue #34); everything here only reads, as it
runs again on every resume (see ``graph/_review.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage

from effectgate._intent import default_operation_id
from effectgate.answers import (
    flags_of,
    recorded_decision,
    review_description,
    started,
)
from effectgate.errors import ToolCallError
from effectgate.graph._messages import (
    PendingCall,
)
from effectgate.graph._policy import Policy
from effectgate.graph._state import (
    ActionRequest,
    ReviewConfig,
)
from effectgate.ledger import (
    UNFINISHED,
    DamagedOperation,
    Ledger,
    Operation,
    OperationTombstone,
    OpState,
)
from effectgate.tools import EffectKind, ToolSpec

__all__ = [
    "Prepared",
    "bound_to_other_intent",
    "choose_operation_id",
    "prepare_calls",
    "replaced_intents",
]

_REFUSED = frozenset({OpState.REJECTED})
"""Terminal states that answer one call, not the business action: a reviewer's "no"."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """A pending effect call, normalized, with what the reviewer is shown."""

    call: PendingCall
    spec: ToolSpec
    args: Any
    request: ActionRequest
    config: ReviewConfig
    auto: bool
    """Approved by policy without asking."""
    duplicate_in_message: str | None = None
    """Another call of the same message maps to the same operation."""
    settled: bool = False
    """The operation already ended with these arguments; dispatch only reads it back."""
    refused_repeat: Mapping[str, Any] | None = None
    """Rejected in this thread as often as the policy allows: not asked again."""


def _opened_by(op: Operation, thread_id: str, tool_call_id: str) -> bool:
    """Whether ``op`` was opened by this very call (thread and tool-call id)."""
    return (op.thread_id, op.tool_call_id) == (thread_id, tool_call_id)


def _belongs(op: Operation, *, keyed: bool, thread_id: str, tool_call_id: str) -> bool:
    """Whether an existing operation under a candidate id is this call's to use."""
    own = _opened_by(op, thread_id, tool_call_id)
    if not keyed:
        # ``{thread_id}:{tool_call_id}`` is ambiguous when the ids contain
        # ':' (thread ``x`` + call ``y:c`` and thread ``x:y`` + call ``c``):
        # only the call that opened the operation may use it.
        return own
    # A business key is shared on purpose (one business action), except when a reviewer
    # rejected the call that opened it: that "no" was about that call.
    return own or op.state not in _REFUSED


def choose_operation_id(
    spec: ToolSpec,
    args: Any,
    *,
    ledger: Ledger,
    thread_id: str,
    tool_call_id: str,
    known: Mapping[str, Operation | None] | None = None,
) -> tuple[str, Operation | None]:
    """Choose the operation id (the idempotency key) of one call, against the ledger.

    The base id is ``spec.operation_id_for(...)``: the tool's business key, or
    ``{thread_id}:{tool_call_id}``. It is used when no operation has it yet or
    the existing one belongs to this call; otherwise ``{base}#2``,
    ``{base}#3``, ... are tried in order until one is free or belongs. An
    existing operation under a candidate id never belongs when its own
    arguments give another base id (a key that itself ends in ``#2``). An
    existing operation belongs to this call when

    - for a thread-scoped id: it was opened by this very thread and call
      (anything else is two ids colliding on ``:``);
    - for a business key: it was opened by this call, or it is not
      REJECTED. A created ticket, one still in progress, and one FAILED are
      shared across threads (the point of a business key: a
      new run of the same task finds the stored budget and outcome, which
      only an explicit act extends); the call that was rejected still reads
      its own rejection back on a replay or fork.

    Read-only and deterministic: the same ledger state gives the same id,
    which the review node needs because it runs again from its first line on
    every resume (LangGraph re-runs the node). The chosen id is the one the
    reviewer is shown, dispatch uses, and a keyed tool sends as its
    idempotency key, so a retry after a rejection is a fresh request.

    Args:
        spec: the call's tool.
        args: the call's normalized arguments (``spec.normalize``).
        ledger: read for the operations already under each candidate id.
        thread_id: the thread proposing the call.
        tool_call_id: the model's id of the call.
        known: what the ledger holds under some candidate ids, already read
            (``None`` for a free id); the others are read here.

    Returns:
        The base id or its first ``#n`` variant that is free or belongs to this
        call, and the operation already under it (``None`` if free).

    Raises:
        LedgerCorruptError: an existing operation fails validation.

    Note:
        A reviewer's rejection answers the call that was shown, not every
        later call with the same key: without a fresh id a new call (another
        thread, days later) would be "settled" as rejected without anyone
        being asked, and the action lost (invariant 2 of docs/architecture.md).
    """
    base = spec.operation_id_for(args, thread_id=thread_id, tool_call_id=tool_call_id)
    keyed = base != default_operation_id(thread_id, tool_call_id)
    candidate, n = base, 1
    read = known or {}
    while (
        op := read[candidate] if candidate in read else ledger.get(candidate)
    ) is not None and not (
        _same_base(spec, op, base, suffixed=n > 1)
        and _belongs(op, keyed=keyed, thread_id=thread_id, tool_call_id=tool_call_id)
    ):
        n += 1
        candidate = f"{base}#{n}"
    return candidate, op


def bound_to_other_intent(
    op_id: str,
    ihash: str,
    *,
    existing: Operation | None,
    tombstone: OperationTombstone | None,
) -> dict[str, Any] | None:
    """The binding check: whether ``op_id`` is bound to an intent other than ``ihash``.

    The one place review (the request's ``conflict``, an edit's refusal)
    decides it; dispatch's own check is ``Ledger.open``. The binding is the
    operation under the id, or, when retention compacted it, its tombstone
    (``OperationTombstone.binds_other_intent``): the service still holds the
    idempotency key, so a compaction never frees the id for new arguments.

    Args:
        op_id: the chosen operation id.
        ihash: the intent hash of the proposed (or edited) arguments.
        existing: the operation under ``op_id``, if any.
        tombstone: the tombstone of ``op_id``, read when ``existing`` is ``None``.

    Returns:
        ``None`` when the id is free for ``ihash``; otherwise the conflict
        ``{operation_id, stored_intent_hash, stored_args, stored_state}``
        (``stored_args`` is ``None`` and ``compacted`` holds the tombstone's
        summary when only a tombstone is left).
    """
    if existing is not None:
        if existing.intent_hash == ihash:
            return None
        return {
            "operation_id": op_id,
            "stored_intent_hash": existing.intent_hash,
            "stored_args": dict(existing.args),
            "stored_state": existing.state.value,
        }
    if tombstone is None or not tombstone.binds_other_intent(ihash):
        return None
    return {
        "operation_id": op_id,
        "stored_intent_hash": tombstone.intent_hash,
        "stored_args": None,
        "stored_state": tombstone.state.value,
        "compacted": tombstone.summary(),
    }


def _same_base(spec: ToolSpec, op: Operation, base: str, *, suffixed: bool) -> bool:
    """Whether ``op`` was opened under ``base`` (or one of its ``#n`` variants).

    A business key may itself end in ``#2`` (an alert literally named
    ``K#2``): its operation must never pass for the second operation of key
    ``K``, nor the reverse. The stored arguments say which key an operation
    was opened for, so ids stay as they were and old ledgers read the same.
    """
    if op.tool != spec.name:
        return False
    try:
        args = spec.normalize(dict(op.args), tool_call_id=op.tool_call_id)
        own = spec.operation_id_for(args, thread_id=op.thread_id, tool_call_id=op.tool_call_id)
    except ToolCallError:
        return not suffixed  # the tool changed: judge the base id as before
    return own == base


_MAY_TAKE_EFFECT = (UNFINISHED - {OpState.PROPOSED}) | {OpState.SUCCEEDED}
"""States of an operation that took effect, or was approved and may still take it."""


def _same_intent(
    same: Sequence[Operation], op_id: str, thread_id: str
) -> tuple[str | None, list[Operation]]:
    """A possible duplicate elsewhere, and this thread's rejected operations, of one intent.

    Any thread of this ledger: the same intent that took effect elsewhere (a
    second run of the same task, a re-plan with new call ids), or that was
    approved there and may still take it (two runs of one task at once), is
    worth a human's look, and is never approved by policy alone. Two reviews
    that neither sees the other's yet still both pass: this is a reviewer's
    aid, not a lock (README, "what it does not do"). The same intent a
    reviewer of this thread rejected is a repeat the model was told not to
    make. ``same``: the ledger's operations of the intent, oldest first.
    """
    dup = None
    rejected = []
    for op in same:
        if op.operation_id == op_id:
            continue
        if dup is None and op.state in _MAY_TAKE_EFFECT:
            dup = op.operation_id
        if op.state is OpState.REJECTED and op.thread_id == thread_id:
            rejected.append(op)
    return dup, rejected


def _compacted_duplicate(
    tombstones: Sequence[OperationTombstone], op_id: str
) -> OperationTombstone | None:
    """The latest compacted operation of this intent that took effect (not ``op_id`` itself).

    Retention compacts a terminal operation to a tombstone that keeps its
    intent hash for the deduplication window (``effectgate.retention``): a
    repeat of that intent under another id is still a possible duplicate.
    ``tombstones``: the intent's tombstones, oldest finish first.
    """
    found = [t for t in tombstones if t.operation_id != op_id and t.state is OpState.SUCCEEDED]
    return found[-1] if found else None


def _repeat_flag(ledger: Ledger, rejected: Sequence[Operation]) -> dict[str, Any] | None:
    if not rejected:
        return None
    last = rejected[-1]
    approval = ledger.latest_approval(last.operation_id)
    return {
        "operation_id": last.operation_id,
        "reason": (approval.message if approval is not None else None) or "no reason given",
        "times_rejected": len(rejected),
    }


def replaced_intents(
    messages: Sequence[AnyMessage], specs: Mapping[str, ToolSpec]
) -> dict[str, str]:
    """Intent hash -> operation id, for each call of the thread a reviewer's edit replaced.

    The model's original arguments stay in its message; the answer of an
    edited call says what ran instead. A later call with the original
    arguments is flagged: the reviewer already said what should happen.
    """
    edited: dict[str, str] = {}
    for m in messages:
        if isinstance(m, ToolMessage) and "replaced this tool call" in str(m.content):
            try:
                payload = json.loads(str(m.content))
            except ValueError:
                continue
            edited[m.tool_call_id] = str(payload.get("operation_id", ""))
    if not edited:
        return {}
    out: dict[str, str] = {}
    for m in messages:
        if not isinstance(m, AIMessage):
            continue
        for call in m.tool_calls:
            spec = specs.get(call["name"])
            if call.get("id") not in edited or spec is None:
                continue
            try:
                args = spec.normalize(call["args"], tool_call_id=call["id"])
            except ToolCallError:
                continue
            out[spec.intent_hash(args)] = edited[str(call["id"])]
    return out


def _approved_by(ledger: Ledger, op: Operation, thread_id: str, call_id: str, ihash: str) -> bool:
    """Whether this very call's approval of these arguments is recorded and still stands."""
    if op.state is not OpState.APPROVED or not _opened_by(op, thread_id, call_id):
        return False
    found = recorded_decision(
        ledger,
        thread_id,
        {"operation_id": op.operation_id, "tool_call_id": call_id, "intent_hash": ihash},
    )
    return found is not None and found[0] == "approve"


def _prepare_one(
    call: PendingCall,
    spec: ToolSpec,
    *,
    ledger: Ledger,
    policy: Policy,
    thread_id: str,
    replaced: Mapping[str, str],
) -> Prepared:
    args = spec.normalize(call.args, tool_call_id=call.id)
    ihash = spec.intent_hash(args)
    base = spec.operation_id_for(args, thread_id=thread_id, tool_call_id=call.id)
    # One reading for the id and the intent (one round trip on PostgreSQL);
    # a taken id's ``#n`` variants, rare, are read one by one.
    # A row of the same intent that fails validation (a damaged ledger) does
    # not stop the review: the call is flagged, and a person decides.
    unreadable: list[DamagedOperation] = []
    near, near_tombs = ledger.intent_neighbours(base, ihash, damaged=unreadable)
    at_base = next((op for op in near if op.operation_id == base), None)
    op_id, existing = choose_operation_id(
        spec, args, ledger=ledger, thread_id=thread_id, tool_call_id=call.id, known={base: at_base}
    )
    tombs = {t.operation_id: t for t in near_tombs}
    # This very id was used before and compacted: a replay or a new run reached it.
    reopened = None
    if existing is None:
        read = op_id == base or op_id in tombs
        reopened = tombs.get(op_id) if read else ledger.operation_tombstone(op_id)
    conflict = bound_to_other_intent(op_id, ihash, existing=existing, tombstone=reopened)
    dup, rejected = _same_intent([op for op in near if op.intent_hash == ihash], op_id, thread_id)
    dup_tomb = (
        None
        if dup is not None
        else _compacted_duplicate([t for t in near_tombs if t.intent_hash == ihash], op_id)
    )
    repeat = _repeat_flag(ledger, rejected)
    replaced_by = replaced.get(ihash)
    ttl = policy.approval_ttl_s
    request = ActionRequest(
        name=spec.name,
        args=spec.args_dict(args),
        description="",  # review_description, once every flag is set
        tool_call_id=call.id,
        operation_id=op_id,
        intent_hash=ihash,
        effect_kind=spec.kind.value,
        preview=spec.render_preview(args, operation_id=op_id),
        approval_ttl_s=ttl,
        possible_duplicate_of=dup if dup_tomb is None else dup_tomb.operation_id,
        conflict=conflict,
    )
    if dup_tomb is not None:
        request["possible_duplicate_compacted"] = dup_tomb.summary()
    if reopened is not None:
        request["compacted_operation"] = reopened.summary()
    if repeat is not None:
        request["repeat_of_rejected"] = repeat
    if replaced_by is not None:
        request["replaced_by_edit"] = replaced_by
    if unreadable:
        request["unreadable_same_intent"] = [
            {"operation_id": d.operation_id, "thread_id": d.thread_id, "reason": d.reason[:300]}
            for d in unreadable
        ]
    request["description"] = review_description(policy.description_prefix, request)
    allowed: list[Any] = ["edit", "reject"] if conflict else ["approve", "edit", "reject"]
    # A call whose operation already ended with these very arguments cannot
    # act again (dispatch returns the stored outcome), so nobody is asked.
    # One that started (in flight, unknown, parked for reconciliation) can no
    # longer be stopped by a "no": dispatch shows its state and asks for a
    # verdict instead, so no reject ever claims it did not run. One whose
    # decision this very call already recorded (a process killed right after
    # recording it) is not asked again: the answer was consumed.
    settled = (
        existing is not None
        and conflict is None
        and (
            existing.is_terminal
            or started(existing.state)
            or _approved_by(ledger, existing, thread_id, call.id, ihash)
        )
    )
    # Policy may approve without asking, but never an unsafe tool, a call whose
    # operation id is bound to other arguments, or one carrying any of the
    # review flags (answers.REVIEW_FLAGS: a possible duplicate, of a compacted
    # operation too; a repeat of a rejected call; a compacted id, whose outcome
    # is no longer in the ledger; a call an edit replaced; a damaged ledger row
    # of the same intent).
    policy_approves = not spec.needs_review or spec.name in policy.auto_approve
    flagged = bool(conflict) or bool(flags_of(request))
    auto = settled or (policy_approves and spec.kind is not EffectKind.UNSAFE and not flagged)
    # Proposed again past the cap after rejections: refused without asking.
    refused = not settled and len(rejected) >= policy.max_repeats_after_reject
    return Prepared(
        call=call,
        spec=spec,
        args=args,
        request=request,
        config=ReviewConfig(action_name=spec.name, allowed_decisions=allowed),
        auto=auto and not refused,
        settled=settled,
        refused_repeat=repeat if refused else None,
    )


def prepare_calls(
    calls: Sequence[PendingCall],
    specs: Mapping[str, ToolSpec],
    *,
    ledger: Ledger,
    policy: Policy,
    thread_id: str,
    messages: Sequence[AnyMessage] = (),
) -> list[Prepared]:
    """Normalize the pending effect calls and build their review requests (reads only).

    Args:
        calls: unanswered calls of the last AI message that name effect tools
            with valid arguments (the tools node answered the others).
        specs: effect tools by name.
        ledger: read for existing operations and possible duplicates.
        policy: approval TTL and auto-approval rules.
        thread_id: the thread.
        messages: the thread's history, read for calls a reviewer's edit replaced.

    Returns:
        One ``Prepared`` per call, in order.
    """
    out: list[Prepared] = []
    seen: dict[str, str] = {}
    replaced = replaced_intents(messages, specs) if messages else {}
    for call in calls:
        prepared = _prepare_one(
            call,
            specs[call.name],
            ledger=ledger,
            policy=policy,
            thread_id=thread_id,
            replaced=replaced,
        )
        op_id = prepared.request["operation_id"]
        if op_id in seen:
            prepared = Prepared(
                call=prepared.call,
                spec=prepared.spec,
                args=prepared.args,
                request=prepared.request,
                config=prepared.config,
                auto=False,
                duplicate_in_message=seen[op_id],
            )
        else:
            seen[op_id] = call.id
        out.append(prepared)
    return out
