"""The review node: one ``interrupt()`` for every pending side-effecting call.

Everything before ``interrupt()`` runs again on every resume
(LangGraph re-runs it from its first line), so that part only reads: it normalizes arguments,
derives operation ids and intent hashes, renders previews and looks up
possible duplicates. Operation ids are chosen against the ledger
(``choose_operation_id``), and the same ledger state always gives the same
id, so a re-run names the operations the reviewer was shown. Decisions are
validated after the interrupt; a malformed answer is refused by asking again
with the error, so nothing is dispatched and the thread stays resumable. Only
then are the decisions written to the ledger (one transaction), and approved
calls fan out as one ``Send`` each.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph._internal._constants import (
    CONFIG_KEY_CHECKPOINT_MAP,
    CONFIG_KEY_CHECKPOINTER,
    CONFIG_KEY_RESUME_MAP,
    CONFIG_KEY_SCRATCHPAD,
    CONFIG_KEY_TASK_ID,
    INTERRUPT,
    NULL_TASK_ID,
)
from langgraph.graph import END
from langgraph.pregel._task_status import read_task_statuses
from langgraph.types import Command, Send, interrupt

from effectgate import _failpoints
from effectgate._clock import Clock
from effectgate._failpoints import Failpoint
from effectgate._intent import default_operation_id
from effectgate.answers import (
    RESOLVED,
    bind_shown_flags,
    check_decision_allowed,
    check_decision_count,
    check_resume_ids,
    check_unkeyed_resume,
    decision_object,
    edited_args,
    flag_text,
    flags_of,
    is_resume_map,
    new_flags,
    recorded_decision,
    refuse_resume_of_idle,
    respond_text,
    review_decisions,
    review_description,
    started,
)
from effectgate.errors import ConfigError, DecisionError, ToolCallError
from effectgate.graph._messages import (
    PendingCall,
    error_message,
    pending_calls,
    rejection_message,
    respond_message,
)
from effectgate.graph._policy import Policy
from effectgate.graph._state import (
    ActionRequest,
    AgentState,
    EffectTask,
    ReviewConfig,
    ReviewRequest,
    effect_node_name,
)
from effectgate.ledger import (
    UNFINISHED,
    Approval,
    DamagedOperation,
    Ledger,
    OpenRequest,
    Operation,
    OperationTombstone,
    OpState,
)
from effectgate.tools import EffectKind, ToolSpec

__all__ = [
    "Prepared",
    "choose_operation_id",
    "make_review_node",
    "parse_decisions",
    "prepare_calls",
    "refuse_resume_before_run",
    "refuse_unknown_resume",
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


@dataclass(frozen=True, slots=True, kw_only=True)
class _Decided:
    prepared: Prepared
    kind: Literal["approve", "edit", "reject"]
    args: Any
    """Normalized args to execute (edited ones for ``edit``)."""
    operation_id: str
    intent_hash: str
    message: str | None
    by_policy: bool = False
    """Approved by policy, nobody asked."""
    respond: bool = False
    """A ``respond`` decision: recorded as a reject; ``message`` answers the model."""


def _decide_one(p: Prepared, decision: Any, *, thread_id: str, ledger: Ledger) -> _Decided:
    decision = decision_object(decision, f"decision for {p.call.id}")
    kind = decision.get("type")
    check_decision_allowed(
        kind,
        p.config["allowed_decisions"],
        tool=p.spec.name,
        call_id=p.call.id,
        conflict=bool(p.request["conflict"]),
    )
    named = decision.get("tool_call_id")
    if named is not None and named != p.call.id:
        raise DecisionError(f"decision names call {named!r} where {p.call.id!r} was expected")
    for key in ("operation_id", "intent_hash"):
        named = decision.get(key)
        if named is not None and named != p.request[key]:
            raise DecisionError(
                f"decision names {key} {named!r} where the review shows {p.request[key]!r} "
                f"({p.spec.name}, {p.call.id}); review it again"
            )
    if kind == "approve" and (flags := new_flags(p.request, decision)):
        # The review changed since it was shown (another thread's same action
        # was approved or ran meanwhile): the approval was given without the
        # warning, so it does not stand; ask again with it.
        raise DecisionError(
            f"{p.spec.name} ({p.call.id}) changed since this review was shown: it is now "
            f"{' and '.join(flag_text(p.request, f) for f in flags)}; review it again"
        )
    if kind == "edit":
        return _decide_edit(p, decision, thread_id=thread_id, ledger=ledger)
    message = decision.get("message")
    if message is not None and not isinstance(message, str):
        raise DecisionError(f"message for {p.call.id} must be a string")
    if kind == "respond":
        # HITL's "respond": the person answers the model in the tool's place;
        # nothing runs, and the ledger records it as a reject with that text.
        message = respond_text(decision, f"respond to {p.call.id}")
        return _Decided(
            prepared=p,
            kind="reject",
            args=p.args,
            operation_id=p.request["operation_id"],
            intent_hash=p.request["intent_hash"],
            message=message,
            respond=True,
        )
    return _Decided(
        prepared=p,
        kind="approve" if kind == "approve" else "reject",  # edit and respond returned above
        args=p.args,
        operation_id=p.request["operation_id"],
        intent_hash=p.request["intent_hash"],
        message=message,
    )


def _decide_edit(
    p: Prepared, decision: Mapping[str, Any], *, thread_id: str, ledger: Ledger
) -> _Decided:
    edited = edited_args(decision, f"edit of {p.call.id}")
    if edited.get("name", p.spec.name) != p.spec.name:
        raise DecisionError(f"edit of {p.call.id} may not change the tool ({p.spec.name})")
    try:
        args = p.spec.normalize(edited["args"], tool_call_id=p.call.id)
    except ToolCallError as exc:
        raise DecisionError(f"edited arguments refused: {exc}") from exc
    op_id, existing = choose_operation_id(
        p.spec, args, ledger=ledger, thread_id=thread_id, tool_call_id=p.call.id
    )
    ihash = p.spec.intent_hash(args)
    tomb = ledger.operation_tombstone(op_id) if existing is None else None
    conflict = bound_to_other_intent(op_id, ihash, existing=existing, tombstone=tomb)
    if conflict is not None:
        compacted = " (compacted by retention; its arguments are no longer kept)"
        raise DecisionError(
            f"edited arguments map to operation {op_id!r}, which is bound to other arguments "
            f"(state {conflict['stored_state']}){compacted if 'compacted' in conflict else ''}; "
            "reject, or edit to its recorded arguments"
        )
    return _Decided(
        prepared=p, kind="edit", args=args, operation_id=op_id, intent_hash=ihash, message=None
    )


def parse_decisions(
    answer: Any, asked: Sequence[Prepared], *, thread_id: str, ledger: Ledger
) -> tuple[list[_Decided], str | None]:
    """Validate a review resume value against the calls that were asked about.

    Args:
        answer: the resume value: ``{"decisions": [...], "reviewer": str?,
            "shown": [intent_hash, ...]?, "shown_operations": [operation_id, ...]?}``;
            ``shown`` and ``shown_operations`` (filled in by ``Agent``) list
            the intent hashes and operation ids the reviewer saw, in order.
        asked: the calls in the interrupt, in order.
        thread_id: the thread.
        ledger: read to check edited arguments against existing operations.

    Returns:
        The validated decisions in order, and the reviewer name if given.

    Raises:
        DecisionError: wrong shape, wrong count, a decision not allowed for its
            call, a call named out of order, edited args the schema refuses, or
            ``shown`` hashes or operation ids that differ from the calls as
            they are now.
    """
    decisions = review_decisions(answer)
    check_decision_count(len(decisions), len(asked))
    reviewer = answer.get("reviewer")
    if reviewer is not None and not isinstance(reviewer, str):
        raise DecisionError("reviewer must be a string")
    shown = answer.get("shown")
    if shown is not None and list(shown) != [p.request["intent_hash"] for p in asked]:
        # The answer was given to another version of these calls (the tool or
        # its version changed between the interrupt and the resume): an
        # approval binds to what the reviewer saw, so ask again.
        raise DecisionError(
            "the pending calls changed since they were shown (tool version or arguments); "
            "review them again"
        )
    shown_ids = answer.get("shown_operations")
    if shown_ids is not None and list(shown_ids) != [p.request["operation_id"] for p in asked]:
        # Same intent, another operation: a key shown as ``#2`` that another
        # thread's reviewer rejected meanwhile is now ``#3``; the reviewer
        # approved the operation shown, so ask again about this one.
        raise DecisionError(
            "the operation ids changed since they were shown (another thread decided on "
            "the same key meanwhile); review them again"
        )
    return [
        _decide_one(p, d, thread_id=thread_id, ledger=ledger)
        for p, d in zip(asked, decisions, strict=True)
    ], reviewer


def _answer_waiting(config: RunnableConfig) -> bool:
    """Whether a resume value waits for this run of the node (it was shown and answered).

    Reads LangGraph's per-task scratchpad, the same place ``interrupt()``
    reads its answer from; nothing is consumed.
    """
    pad = config.get("configurable", {}).get(CONFIG_KEY_SCRATCHPAD)
    if pad is None:
        return False
    return bool(pad.resume) or pad.get_null_resume(False) is not None


def _resume_writes(config: RunnableConfig) -> list[tuple[str, str, Any]]:
    """The pending writes of the checkpoint this run of the node resumes from (or none)."""
    conf = config.get("configurable", {})
    saver = conf.get(CONFIG_KEY_CHECKPOINTER)
    checkpoint_id = (conf.get(CONFIG_KEY_CHECKPOINT_MAP) or {}).get("")
    if saver is None or checkpoint_id is None:
        return []
    found = saver.get_tuple(
        {
            "configurable": {
                "thread_id": conf.get("thread_id"),
                "checkpoint_ns": "",
                "checkpoint_id": checkpoint_id,
            }
        }
    )
    return list(found.pending_writes or []) if found else []


class ResumeReading:
    """The pending writes of the checkpoint one run of a node resumes from, read at most once.

    The review node asks three questions of those writes in one run (is the
    resume map known, did the client ask to end, what was shown); each used
    to load the checkpoint afresh (``get_tuple``: a read and a deserialize).
    The writes they look at (the interrupts recorded by earlier runs, the
    client's resume writes) were all on the checkpoint before this run
    began, so one reading answers all three.
    """

    __slots__ = ("_config", "_writes")

    def __init__(self, config: RunnableConfig) -> None:
        self._config = config
        self._writes: list[tuple[str, str, Any]] | None = None

    def __call__(self) -> list[tuple[str, str, Any]]:
        """The writes, loaded on the first call."""
        if self._writes is None:
            self._writes = _resume_writes(self._config)
        return self._writes


GOTO_END = f"branch:to:{END}"
"""The channel ``Command(goto="__end__")`` writes to (LangGraph's ``map_command``)."""


def goto_end_asked(config: RunnableConfig, reading: ResumeReading | None = None) -> bool:
    """Whether the client answered this review with ``Command(goto="__end__")``.

    "Mark as resolved" in LangGraph Studio and Agent Inbox sends it. LangGraph
    ignores the write (a graph has no ``branch:to:__end__`` channel) and runs
    the interrupted node again, which would ask the same review again while
    the client was told it succeeded. The write is still saved on the
    checkpoint the review resumes from, as a pending write of no task; the
    review node reads it there and answers the review as resolved.

    ``reading``: the run's ``ResumeReading`` when the caller has one.
    """
    writes = (reading or ResumeReading(config))()
    return any(task == NULL_TASK_ID and channel == GOTO_END for task, channel, _ in writes)


def refuse_unknown_resume(config: RunnableConfig, reading: ResumeReading | None = None) -> None:
    """Refuse a resume map that names no interrupt of this thread (``answers.check_resume_ids``).

    A LangGraph client (``langgraph_sdk`` against ``langgraph dev``, Studio)
    answers with ``Command(resume={interrupt_id: answer})``. LangGraph keeps
    the map in the run's config (``CONFIG_KEY_RESUME_MAP``), not as a write,
    hands each task the value under its own id, and ignores the other keys:
    a wrong id reached nothing, the node ran again and asked the same
    question, and the run ended as if answered. Every node that calls
    ``interrupt()`` calls this first, before anything is written, so the run
    fails with the refusal, nothing is applied (LangGraph saves the error,
    not the answer) and the interrupt waits under the same id.

    Only the run that resumes this task is checked: the map stays in the
    config for the whole run, and a later step's node has no interrupt of its
    own recorded on its checkpoint yet. The ids the map may name are the
    interrupts recorded on the checkpoint it resumes (``_resume_writes``),
    answered ones included, as LangGraph re-runs those on a replay.

    A resume whose keys are not shaped like ids is no map to LangGraph: the
    whole dict arrives as the plain answer (the scratchpad's null resume). At
    effectgate's own review or reconciliation such a dict of answers is
    refused the same way (``answers.check_unkeyed_resume``); a tool's own
    question takes any value.

    Args:
        config: the node's run config.
        reading: the run's ``ResumeReading``, shared with the node's other
            questions to the same checkpoint (default: a reading of its own).

    Raises:
        UnknownInterruptError: the map is empty or names an id that is not
            an interrupt of this thread's checkpoint, or a plain answer is a
            dict of answers keyed by non-ids; nothing was applied.
    """
    conf = config.get("configurable", {})
    named = conf.get(CONFIG_KEY_RESUME_MAP)
    task_id = conf.get(CONFIG_KEY_TASK_ID)
    pad = conf.get(CONFIG_KEY_SCRATCHPAD)
    if task_id is None or (named is None and pad is None):
        return
    statuses = read_task_statuses((reading or ResumeReading(config))())
    if task_id not in statuses or not statuses[task_id].interrupts:
        return  # this task is not the one resumed (a later step of the same run)
    pending = {i.id: i.value for status in statuses.values() for i in status.pending_interrupts}
    if named is None:
        # A plain resume value: a dict keyed by a non-id is a mistyped map.
        if pad is None:
            return
        mine = statuses[task_id].pending_interrupts
        kind = mine[-1].value.get("type") if mine and isinstance(mine[-1].value, Mapping) else None
        check_unkeyed_resume(pad.get_null_resume(False), kind=str(kind), pending=pending)
        return
    known = {i.id for status in statuses.values() for i in status.interrupts}
    check_resume_ids(list(named), known=known, pending=pending)


def refuse_resume_before_run(
    resume: Any, *, has_tasks: bool, writes: Iterable[tuple[str, str, Any]]
) -> None:
    """Refuse, before a run starts, a resume that no node could take.

    Two cases the nodes' own check (``refuse_unknown_resume``) cannot serve:

    - a resume to a thread that waits on no interrupt and has no task left
      (finished, or its last review answered by another client): LangGraph
      runs no node for it, so nothing refuses it and the run "succeeds"
      having applied nothing (``answers.refuse_resume_of_idle``);
    - a resume map naming an interrupt that does not wait on the checkpoint
      (mistyped, another thread's, already answered): the node refuses it,
      but inside the run, so LangGraph records the refusal as that task's
      error on the checkpoint, and a superstep's writes stay until the step
      ends: ``get_state(...).tasks[i].error`` went on showing the refused
      answer's text after the review was asked again (beside the new
      review's own ``error``). Refused here, nothing is written.

    The same rules as the nodes (``answers.check_resume_ids``), read from the
    same place: the pending writes of the checkpoint the resume addresses. A
    graph that calls this before every run (``guard_resumes``, the served
    graph) refuses these resumes with the nodes' words; the nodes keep their
    check for graphs run without it.

    Args:
        resume: the ``Command.resume`` value.
        has_tasks: whether the addressed checkpoint has tasks left to run
            (``StateSnapshot.next``).
        writes: that checkpoint's pending writes, ``(task_id, channel, value)``.

    Raises:
        UnknownInterruptError: one line naming the unknown id(s) and what
            waits; nothing was applied and the pending interrupts keep their ids.
    """
    statuses = read_task_statuses(list(writes))
    pending = {i.id: i.value for status in statuses.values() for i in status.pending_interrupts}
    if not has_tasks and not pending:
        # Finished tasks on a head with nothing next: a step whose run was cut
        # off before its checkpoint (a rollback); a run with no input ends it.
        refuse_resume_of_idle(resume, step_left=any(s.finished for s in statuses.values()))
    if pending and is_resume_map(resume):
        known = {i.id for status in statuses.values() for i in status.interrupts}
        check_resume_ids(list(resume), known=known, pending=pending)


def _shown_review(config: RunnableConfig, reading: ResumeReading) -> Mapping[str, Any] | None:
    """The review request this run of the node was shown under, read from its checkpoint.

    LangGraph keeps an interrupt's value as a pending write of its task on the
    checkpoint the run resumes from; a raw client's answer is bound to what
    that value's descriptions showed (``answers.bind_shown_flags``). ``None``
    when there is no checkpointer or no such write (a first run).
    """
    task_id = config.get("configurable", {}).get(CONFIG_KEY_TASK_ID)
    if task_id is None:
        return None
    shown = None
    for write_task, channel, value in reading():
        if write_task != task_id or channel != INTERRUPT:
            continue
        for item in value if isinstance(value, list) else [value]:
            payload = getattr(item, "value", None)
            if isinstance(payload, Mapping) and payload.get("type") == "review":
                shown = payload
    return shown


def _as_shown(askable: Sequence[Prepared], answer: Any, asked: list[Prepared]) -> list[Prepared]:
    """The calls as they were shown, when the answer says which (``shown_operations``)."""
    shown = answer.get("shown_operations") if isinstance(answer, Mapping) else None
    if not isinstance(shown, list):
        return asked
    by_op = {p.request["operation_id"]: p for p in askable}
    if not all(op in by_op for op in shown):
        return asked  # parse_decisions names the difference and asks again
    return [by_op[op] for op in shown]


def make_review_node(
    *, specs: Mapping[str, ToolSpec], ledger: Ledger, policy: Policy, clock: Clock
) -> Any:
    """Build the ``review`` node function (docs/architecture.md, "The graph").

    Returns:
        ``review(state, config) -> Command``: fans approved calls out as
        ``Send("effect:<tool>", EffectTask)`` and answers rejected ones.
    """

    def review(state: AgentState, config: RunnableConfig) -> Command[Any]:
        reading = ResumeReading(config)
        refuse_unknown_resume(config, reading)
        thread_id = str(config["configurable"]["thread_id"])
        calls = pending_calls(state["messages"])
        # Reads and malformed calls were answered before the review; a call
        # left for a tool this graph lacks means it was rebuilt with fewer
        # tools than the thread began with. Dropping the call would lose it.
        missing = sorted({c.name for c in calls if c.name not in specs})
        if missing:
            raise ConfigError(
                f"thread {thread_id!r} has calls waiting for review to {', '.join(missing)}, "
                "which this agent does not have as side-effect tools; rebuild it with the "
                "same tools the thread started with"
            )
        prepared = prepare_calls(
            calls,
            specs,
            ledger=ledger,
            policy=policy,
            thread_id=thread_id,
            messages=state["messages"],
        )
        askable = [
            p
            for p in prepared
            if not p.settled and p.duplicate_in_message is None and p.refused_repeat is None
        ]
        asked = [p for p in askable if not p.auto]
        if not asked and _answer_waiting(config):
            # This review was shown and answered, but the calls no longer look
            # as if they need a person (a possible duplicate settled meanwhile,
            # the policy changed): whether a call needs review was decided when
            # it was shown, and the answer given to it is consumed, never
            # replaced by an automatic approval.
            asked = askable
        decided: list[_Decided] = []
        reviewer = None
        resolved = bool(asked) and goto_end_asked(config, reading)
        if resolved:
            # "Mark as resolved": every call of the review is closed as a
            # reviewer's reject (recorded in the ledger), and the thread ends.
            decided = [
                _Decided(
                    prepared=p,
                    kind="reject",
                    args=p.args,
                    operation_id=p.request["operation_id"],
                    intent_hash=p.request["intent_hash"],
                    message=RESOLVED,
                )
                for p in askable
            ]
        elif asked:
            request = ReviewRequest(
                type="review",
                thread_id=thread_id,
                action_requests=[p.request for p in asked],
                review_configs=[p.config for p in asked],
            )
            answer = interrupt(request)
            shown = _shown_review(config, reading)
            if shown is not None:  # a raw client's answer: bound to the flags it was shown
                answer = bind_shown_flags(shown, answer)
            asked = _as_shown(askable, answer, asked)
            while True:  # each refusal asks again; answers are replayed in order
                try:
                    decided, reviewer = parse_decisions(
                        answer, asked, thread_id=thread_id, ledger=ledger
                    )
                    break
                except DecisionError as exc:
                    answer = interrupt(ReviewRequest(**request, error=str(exc)))
                    answer = bind_shown_flags(shown or request, answer)
        by_id = {d.prepared.call.id: d for d in decided}
        for p in prepared:
            if p.auto and p.call.id not in by_id:  # a person's answer always wins
                by_id[p.call.id] = _Decided(
                    prepared=p,
                    kind="approve",
                    args=p.args,
                    operation_id=p.request["operation_id"],
                    intent_hash=p.request["intent_hash"],
                    message=None,
                    by_policy=True,
                )
        return _record_and_route(
            prepared,
            by_id,
            reviewer or policy.reviewer,
            thread_id=thread_id,
            ledger=ledger,
            policy=policy,
            clock=clock,
            end=resolved,
        )

    return review


def _ledger_rows(
    p: Prepared,
    d: _Decided,
    *,
    thread_id: str,
    reviewer: str,
    policy: Policy,
    now: datetime,
) -> tuple[OpenRequest, Approval]:
    """The operation to create-or-get and the approval row for one decided call."""
    ttl = policy.approval_ttl_s
    op = OpenRequest(
        operation_id=d.operation_id,
        thread_id=thread_id,
        tool_call_id=p.call.id,
        tool=p.spec.name,
        tool_version=p.spec.version,
        args=p.spec.args_dict(d.args),
        intent_hash=d.intent_hash,
        budget=policy.budget,
    )
    approval = Approval(
        operation_id=d.operation_id,
        thread_id=thread_id,
        tool_call_id=p.call.id,
        decision=d.kind,
        intent_hash=d.intent_hash,
        reviewer="policy:auto" if d.by_policy else reviewer,
        edited_args=p.spec.args_dict(d.args) if d.kind == "edit" else None,
        message=d.message,
        decided_at=now,
        expires_at=now + timedelta(seconds=ttl) if ttl else None,
    )
    return op, approval


def _send(p: Prepared, d: _Decided, *, thread_id: str, batch_size: int) -> Send:
    task = EffectTask(
        thread_id=thread_id,
        tool_call_id=p.call.id,
        tool=p.spec.name,
        args=p.spec.args_dict(d.args),
        operation_id=d.operation_id,
        intent_hash=d.intent_hash,
        edited=d.kind == "edit",
        batch_size=batch_size,
    )
    return Send(effect_node_name(p.spec.name), task)


def _unrunnable_answer(p: Prepared, d: _Decided | None) -> ToolMessage | None:
    """Answer calls that never reach the ledger: in-message duplicates, rejected conflicts."""
    if p.refused_repeat is not None:
        return error_message(
            p.call,
            f"rejected again; not executed; do not propose it again: a reviewer rejected this "
            f"same call {p.refused_repeat['times_rejected']} time(s) in this thread (last: "
            f"operation {p.refused_repeat['operation_id']}, reason: "
            f"{p.refused_repeat['reason']}). The run stops here",
            status="refused_repeat",
        )
    if p.duplicate_in_message is not None or d is None:
        return error_message(
            p.call,
            "not executed: this call maps to the same operation as call "
            f"{p.duplicate_in_message} in the same message",
        )
    if d.kind == "reject" and p.request["conflict"]:
        # The operation id belongs to other arguments: record nothing on it.
        return _no(p, d, operation_id=None)
    return None


def _no(
    p: Prepared, d: _Decided, *, operation_id: str | None, note: str | None = None
) -> ToolMessage:
    """Answer a call a person said no to: a rejection, or their own answer (``respond``)."""
    if d.respond and d.message:
        return respond_message(
            tool_call_id=p.call.id, tool=p.spec.name, message=d.message, operation_id=operation_id
        )
    return rejection_message(
        tool_call_id=p.call.id,
        tool=p.spec.name,
        message=d.message,
        operation_id=operation_id,
        note=note,
    )


def _opened_elsewhere(ledger: Ledger, op_id: str, thread_id: str, tool_call_id: str) -> bool:
    """Whether ``op_id`` exists and was opened by another call (a shared business key)."""
    op = ledger.get(op_id)
    return op is not None and not _opened_by(op, thread_id, tool_call_id)


def _keep_replaced(
    runnable: Sequence[tuple[Prepared, _Decided]], ledger: Ledger, reviewer: str
) -> None:
    """Keep the intent an edit replaced with the operation (an audit note)."""
    for p, d in runnable:
        if d.kind == "edit" and d.intent_hash != p.request["intent_hash"]:
            # A later proposal of the replaced intent is flagged from the history.
            ledger.note(
                d.operation_id,
                {
                    "replaced_intent_hash": p.request["intent_hash"],
                    "replaced_args": p.request["args"],
                    "reviewer": reviewer,
                },
            )


def _answer_rejected(
    rejected: Sequence[tuple[Prepared, _Decided]],
    states: Mapping[str, OpState],
    runnable: list[tuple[Prepared, _Decided]],
) -> list[ToolMessage]:
    """Answer rejected calls truthfully; one whose operation started goes to dispatch."""
    out = []
    for p, d in rejected:
        state = states.get(d.operation_id, OpState.REJECTED)
        if started(state):
            # The "no" came too late: the operation started meanwhile (another
            # thread's call under a shared key). Only dispatch can say what
            # happened; "not executed" would be a guess.
            runnable.append((p, d))
            continue
        note = None
        if state is not OpState.REJECTED:
            note = (
                f"operation {d.operation_id} is {state.value}: an earlier attempt may have "
                "taken effect; no further attempt is made for this call"
            )
        out.append(_no(p, d, operation_id=d.operation_id, note=note))
    return out


def _record_and_route(
    prepared: Sequence[Prepared],
    by_id: Mapping[str, _Decided],
    reviewer: str,
    *,
    thread_id: str,
    ledger: Ledger,
    policy: Policy,
    clock: Clock,
    end: bool = False,
) -> Command[Any]:
    now = clock.now()
    rows: list[tuple[OpenRequest, Approval]] = []
    messages: list[ToolMessage] = []
    runnable: list[tuple[Prepared, _Decided]] = []
    rejected: list[tuple[Prepared, _Decided]] = []
    for p in prepared:
        d = by_id.get(p.call.id)
        answer = _unrunnable_answer(p, d)
        if answer is not None or d is None:
            messages += [answer] if answer is not None else []
            continue
        if d.kind == "reject" and _opened_elsewhere(ledger, d.operation_id, thread_id, p.call.id):
            # A business-keyed operation another call opened (and may have had
            # approved): this "no" answers this call only. Rejecting the shared
            # operation would cancel the other thread's approved action.
            ledger.note(
                d.operation_id,
                {
                    "rejected_call": {"thread_id": thread_id, "tool_call_id": p.call.id},
                    "reviewer": reviewer,
                    "left_unchanged": True,
                },
            )
            note = f"operation {d.operation_id} belongs to another call and was left to it"
            messages.append(_no(p, d, operation_id=d.operation_id, note=note))
            continue
        if not p.settled:  # a settled operation has nothing left to approve
            rows.append(
                _ledger_rows(p, d, thread_id=thread_id, reviewer=reviewer, policy=policy, now=now)
            )
        if d.kind == "reject":
            rejected.append((p, d))
        else:
            runnable.append((p, d))
    states: dict[str, OpState] = {}
    if rows:
        recorded = ledger.record_review([r[0] for r in rows], [r[1] for r in rows])
        states = {op.operation_id: op.state for op in recorded}
    _keep_replaced(runnable, ledger, reviewer)
    _failpoints.hit(Failpoint.AFTER_REVIEW_RECORDED)
    messages += _answer_rejected(rejected, states, runnable)
    sends = [_send(p, d, thread_id=thread_id, batch_size=len(runnable)) for p, d in runnable]
    update = {"messages": messages} if messages else None
    if not sends and (end or any(p.refused_repeat is not None for p in prepared)):
        # The model keeps proposing what a reviewer keeps rejecting: stop the
        # run instead of asking the same question again and again.
        return Command(goto=END, update=update)
    return Command(goto=sends or "agent", update=update)
