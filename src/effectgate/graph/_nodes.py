"""The agent, tools and effect nodes.

``effect:<tool>`` is a thin adapter over ``Dispatcher``: it turns an
``Outcome`` into exactly one ``ToolMessage``, or into an ``interrupt()`` when a
human must decide (an expired approval, an outcome nobody can know).
Everything before an ``interrupt()`` here re-runs on resume; it is dispatch,
which reads the ledger first and repeats nothing the ledger knows started.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp
from langgraph.types import Command, Send, interrupt

from effectgate import _failpoints
from effectgate._clock import Clock
from effectgate._failpoints import Failpoint
from effectgate.answers import check_review_answer, respond_text, review_description
from effectgate.dispatch import Dispatcher, DispatchStatus, EffectCall, Outcome, validate_verdict
from effectgate.errors import (
    ConfigError,
    DecisionError,
    FollowUpError,
    Rejected,
    ToolCallError,
    ToolError,
)
from effectgate.graph._follow_up import (
    answered_after_follow_up,
    before_follow_up,
    close_open_calls,
    follow_up_index,
)
from effectgate.graph._messages import (
    PendingCall,
    answer_id,
    effect_message,
    error_message,
    pending_calls,
    rejection_message,
    respond_message,
    unanswered_calls,
    with_call_ids,
    with_fixed_args,
    with_unique_call_ids,
)
from effectgate.graph._policy import Policy
from effectgate.graph._review import refuse_unknown_resume
from effectgate.graph._state import (
    ActionRequest,
    AgentState,
    EffectTask,
    ReconciliationRequest,
    ReviewConfig,
    ReviewRequest,
    effect_node_name,
)
from effectgate.ledger import Approval, Ledger, OpenRequest
from effectgate.tools import ToolContext, ToolSpec

__all__ = [
    "make_agent_node",
    "make_effect_node",
    "make_tools_node",
    "malformed_reason",
]


def make_agent_node(
    model: BaseChatModel,
    specs: Mapping[str, ToolSpec],
    system_prompt: str | None,
    *,
    ledger: Ledger,
    clock: Clock,
) -> Any:
    """Build the ``agent`` node: one model call with every tool bound.

    A follow-up message a LangGraph client sent as new input while a review
    waited (LangGraph writes it and drops the pending review task) meets the
    one follow-up rule (``graph._follow_up.close_open_calls``): calls that
    provably never started are answered "superseded" before the message (the
    operations they opened are rejected in the ledger) and the model sees a
    valid history; a call that may have started refuses the message with a
    ``FollowUpError`` naming the tool and operation, and the model is not
    called. In a graph run (where the new input already dropped the
    interrupt) that refusal is not raised: the node writes nothing, the
    open calls go back through the review and their effect nodes ask their
    verdicts again, and the message is answered once they are, with their
    answers moved before it (``answered_after_follow_up``). ``Agent.send``
    refuses such a message before anything is written.

    A model error propagates: the step fails, the checkpoint keeps the
    thread, and a resume calls the model again (model calls have no side
    effects; ChatOpenAI's own retries are set explicitly by the factory).

    Before the reply is written, a call without an id gets one
    (``with_call_ids``) and a call whose id the thread already holds gets a
    fresh one (``with_unique_call_ids``): the default operation id is
    ``{thread_id}:{tool_call_id}``, so a reused id would alias a new action
    onto an earlier operation.
    """
    bound = model.bind_tools([s.to_openai_tool() for s in specs.values()])

    def agent(state: AgentState, config: RunnableConfig) -> dict[str, Any] | Command[Any]:
        history = list(state["messages"])
        thread_id = config["configurable"]["thread_id"]
        moved: list[Any] = []
        idx = follow_up_index(history)
        if idx is not None:
            try:
                answers = close_open_calls(
                    history, specs=specs, ledger=ledger, thread_id=str(thread_id), now=clock.now()
                )
            except FollowUpError as exc:
                if not exc.started:
                    raise
                # A call of the last AI message may have started (its verdict
                # waits): the message may not close it, and the new input
                # dropped the interrupt that asked for it. Nothing is written:
                # those calls go back to their effect nodes, which ask for
                # their verdicts again; the message stays in the history and
                # is answered once they are (the calls that never started are
                # then closed as superseded, as for any follow-up).
                return Command(goto=_again(history[idx], exc.started, str(thread_id), ledger))
            history, moved = before_follow_up(history, idx, answers)
        else:
            late = answered_after_follow_up(history)
            if late is not None:  # the calls held back above, answered since
                history, moved = before_follow_up(history, late, [])
        open_calls = unanswered_calls(history)
        if open_calls:
            # A host merged a message after a call, or wrote the state without
            # ``as_node``: the model would get a request every provider refuses,
            # and nothing here can tell whether the call ran.
            named = ", ".join(f"{tool} ({call_id})" for call_id, tool in open_calls)
            raise ConfigError(
                f"the history has tool calls no tool message answers: {named}; the model is "
                "not called. Answer each call (update_state with as_node set to the node that "
                "answers it) or fork the thread from a checkpoint before the change"
            )
        prompt = [SystemMessage(system_prompt), *history] if system_prompt else history
        reply = bound.invoke(prompt)
        if not isinstance(reply, AIMessage):
            reply = AIMessage(content=str(getattr(reply, "content", reply)))
        reply = with_call_ids(reply, salt=f"{thread_id}:{len(history)}")
        reply = with_fixed_args(with_unique_call_ids(reply, history), specs)
        return {"messages": [*moved, reply]}

    return agent


def _again(
    ai: AnyMessage, started: Sequence[tuple[str, str]], thread_id: str, ledger: Ledger
) -> list[Send]:
    """The effect tasks of calls a follow-up could not close, from what the ledger recorded.

    Each runs its operation as approved (its stored arguments and intent
    hash), so its effect node meets it where it stands (a verdict asked
    again, a live attempt waited for, a result reused); nothing is re-reviewed.
    """
    assert isinstance(ai, AIMessage)
    sends = []
    for tool_call_id, operation_id in started:
        op = ledger.get(operation_id)
        if op is None:  # pragma: no cover - follow_up_plan read it just now
            continue
        approval = ledger.latest_approval(operation_id)
        task = EffectTask(
            thread_id=thread_id,
            tool_call_id=tool_call_id,
            tool=op.tool,
            args=dict(op.args),
            operation_id=operation_id,
            intent_hash=op.intent_hash,
            edited=approval is not None and approval.edited_args is not None,
            batch_size=len(started),
        )
        sends.append(Send(effect_node_name(op.tool), task))
    return sends


def malformed_reason(call: PendingCall, specs: Mapping[str, ToolSpec]) -> str | None:
    """Why a call cannot be reviewed or run (unknown tool, bad JSON, schema), or ``None``."""
    if call.parse_error is not None:
        return f"could not parse the arguments of {call.name or 'a tool call'}: {call.parse_error}"
    spec = specs.get(call.name)
    if spec is None:
        return (
            f"unknown tool {call.name!r}; available tools: {', '.join(sorted(specs)) or '(none)'}"
        )
    try:
        spec.normalize(call.args, tool_call_id=call.id)
    except ToolCallError as exc:
        return str(exc)
    return None


def make_tools_node(specs: Mapping[str, ToolSpec]) -> Any:
    """Build the ``tools`` node: run read-only calls, answer malformed ones with errors.

    A read tool declared ``requires_approval=True`` is reviewed first: one
    ``interrupt()`` for every gated read of the message, before any read
    runs; an approved read runs, a rejected one is answered "not executed", and
    a ``respond`` is answered with the person's own words in the read's place.
    Reads leave no trace in the ledger, so nothing else is recorded.
    """

    def tools(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        refuse_unknown_resume(config)  # a gated read asks with interrupt()
        thread_id = str(config["configurable"]["thread_id"])
        out: list[ToolMessage] = []
        calls = pending_calls(state["messages"])
        valid = [c for c in calls if malformed_reason(c, specs) is None]
        gated = [c for c in valid if specs[c.name].is_read and specs[c.name].needs_review]
        verdicts = _review_reads(gated, specs, thread_id) if gated else {}
        for call in calls:
            reason = malformed_reason(call, specs)
            if reason is not None:
                out.append(error_message(call, reason + "; not executed"))
                continue
            spec = specs[call.name]
            if not spec.is_read:
                continue
            decision = verdicts.get(call.id)
            if decision is not None and decision.get("type") == "respond":
                # HITL's respond: the person's words stand in for the read
                out.append(
                    respond_message(
                        tool_call_id=call.id,
                        tool=spec.name,
                        message=respond_text(decision, f"respond to {call.id}"),
                    )
                )
                continue
            if decision is not None and decision.get("type") == "reject":
                message = decision.get("message")
                out.append(
                    rejection_message(
                        tool_call_id=call.id,
                        tool=spec.name,
                        message=message if isinstance(message, str) else None,
                    )
                )
                continue
            out.append(_run_read(spec, call, thread_id))
        return {"messages": out}

    return tools


def _review_reads(
    gated: list[PendingCall], specs: Mapping[str, ToolSpec], thread_id: str
) -> dict[str, Mapping[str, Any]]:
    """Ask a person about the gated reads of one message; their decisions by call id."""
    actions = []
    for call in gated:
        spec = specs[call.name]
        args = spec.normalize(call.args, tool_call_id=call.id)
        actions.append(
            ActionRequest(
                name=spec.name,
                args=spec.args_dict(args),
                description=f"Reading with {spec.name} requires approval",
                tool_call_id=call.id,
                operation_id=f"{thread_id}:{call.id}",
                intent_hash=spec.intent_hash(args),
                effect_kind=spec.kind.value,
                preview=spec.render_preview(args),
                approval_ttl_s=None,
                possible_duplicate_of=None,
                conflict=None,
            )
        )
    for action in actions:  # the standard field a web client shows: preview, kind, id
        action["description"] = review_description(action["description"], action)
    request = ReviewRequest(
        type="review",
        thread_id=thread_id,
        action_requests=actions,
        review_configs=[
            ReviewConfig(action_name=a["name"], allowed_decisions=["approve", "reject"])
            for a in actions
        ],
    )
    answer = interrupt(request)
    while True:
        try:
            check_review_answer(request, answer)
            break
        except DecisionError as exc:
            answer = interrupt(ReviewRequest(**request, error=str(exc)))
    return {call.id: decision for call, decision in zip(gated, answer["decisions"], strict=True)}


def _run_read(spec: ToolSpec, call: PendingCall, thread_id: str) -> ToolMessage:
    args = spec.normalize(call.args, tool_call_id=call.id)
    ctx = ToolContext(
        operation_id=f"{thread_id}:{call.id}", thread_id=thread_id, tool_call_id=call.id, attempt=1
    )
    try:
        result = spec.call(args, ctx)
    except GraphBubbleUp:
        raise  # LangGraph control flow (a tool asking with ``interrupt()``), not a failure
    except Exception as exc:  # noqa: BLE001 - told to the model, as LangGraph's ToolNode does
        return error_message(call, _read_failure(spec, exc))
    payload = {"status": "ok", "result": result.value}
    return ToolMessage(
        content=json.dumps(payload, ensure_ascii=False, sort_keys=True, default=str),
        tool_call_id=call.id,
        name=spec.name,
        id=answer_id(call.id),
    )


def _read_failure(spec: ToolSpec, exc: Exception) -> str:
    """What the model is told when a read tool raised: a failure, never a reviewer's reject."""
    if isinstance(exc, Rejected):
        why = f"the service refused the request: {exc}"
    elif isinstance(exc, ToolError):
        why = str(exc) or type(exc).__name__
    else:
        why = f"{type(exc).__name__}: {exc}"
    return f"{spec.name} failed: {why}. It is a read: it had no side effect"


def make_effect_node(
    spec: ToolSpec, *, dispatcher: Dispatcher, ledger: Ledger, policy: Policy, clock: Clock
) -> Any:
    """Build ``effect:<tool>``: dispatch one reviewed call through the ledger."""

    def effect(task: EffectTask, config: RunnableConfig) -> dict[str, Any]:
        # Before dispatch: a verdict, a re-review or a tool's own question is
        # asked with interrupt(), and dispatch writes to the ledger first.
        refuse_unknown_resume(config)
        call = EffectCall(
            thread_id=task["thread_id"],
            tool_call_id=task["tool_call_id"],
            tool=task["tool"],
            args=task["args"],
            operation_id=task["operation_id"],
            intent_hash=task["intent_hash"],
        )
        outcome = _settle(
            call, spec, dispatcher=dispatcher, ledger=ledger, policy=policy, clock=clock
        )
        msg = effect_message(
            outcome,
            tool_call_id=call.tool_call_id,
            tool=call.tool,
            executed_args=task["args"] if task["edited"] else None,
        )
        if task["batch_size"] > 1:
            _failpoints.hit(Failpoint.MID_SUPERSTEP, tool=spec.name)
        return {"messages": [msg]}

    return effect


def _settle(
    call: EffectCall,
    spec: ToolSpec,
    *,
    dispatcher: Dispatcher,
    ledger: Ledger,
    policy: Policy,
    clock: Clock,
) -> Outcome:
    # Each interrupt() below consumes the next stored answer on a re-run, so
    # answers bound to an earlier attempt are skipped, never re-applied.
    error: str | None = None
    while True:
        outcome = dispatcher.dispatch(call)
        if outcome.status is DispatchStatus.NEEDS_RECONCILIATION:
            error = _ask_verdict(call, outcome, dispatcher, error)
        elif outcome.status is DispatchStatus.NEEDS_REVIEW and outcome.operation is not None:
            error = _ask_review(
                call, spec, outcome, ledger=ledger, policy=policy, clock=clock, error=error
            )
        else:
            return outcome


def _ask_verdict(
    call: EffectCall, outcome: Outcome, dispatcher: Dispatcher, error: str | None
) -> str | None:
    op = outcome.operation
    assert op is not None
    request = ReconciliationRequest(
        type="reconciliation",
        thread_id=call.thread_id,
        tool_call_id=call.tool_call_id,
        operation_id=op.operation_id,
        tool=op.tool,
        attempt=op.attempt,
        evidence=dict(outcome.evidence),
        allowed_verdicts=["succeeded", "failed", "retry"],
    )
    if error:
        request["error"] = error
    answer = interrupt(request)
    try:
        verdict = validate_verdict(answer)
        dispatcher.apply_verdict(op.operation_id, verdict)
    except DecisionError as exc:
        return str(exc)
    return None


def _re_review_request(
    call: EffectCall, spec: ToolSpec, outcome: Outcome, policy: Policy, error: str | None
) -> ReviewRequest:
    op = outcome.operation
    assert op is not None
    args = spec.normalize(call.args, tool_call_id=call.tool_call_id)
    action = ActionRequest(
        name=spec.name,
        args=dict(call.args),
        description="",  # review_description, below
        tool_call_id=call.tool_call_id,
        operation_id=op.operation_id,
        intent_hash=call.intent_hash,
        effect_kind=spec.kind.value,
        preview=spec.render_preview(args, operation_id=op.operation_id),
        approval_ttl_s=policy.approval_ttl_s,
        possible_duplicate_of=None,
        conflict=None,
    )
    action["description"] = review_description(
        f"{policy.description_prefix} again: {outcome.message}", action
    )
    request = ReviewRequest(
        type="review",
        thread_id=call.thread_id,
        action_requests=[action],
        review_configs=[
            ReviewConfig(action_name=spec.name, allowed_decisions=["approve", "reject"])
        ],
    )
    if error:
        request["error"] = error
    return request


def _ask_review(
    call: EffectCall,
    spec: ToolSpec,
    outcome: Outcome,
    *,
    ledger: Ledger,
    policy: Policy,
    clock: Clock,
    error: str | None,
) -> str | None:
    op = outcome.operation
    assert op is not None
    answer = interrupt(_re_review_request(call, spec, outcome, policy, error))
    decisions = answer.get("decisions") if isinstance(answer, Mapping) else None
    if (
        not isinstance(decisions, list)
        or len(decisions) != 1
        or not isinstance(decisions[0], Mapping)
        or decisions[0].get("type") not in ("approve", "reject")
    ):
        return 'answer {"decisions": [{"type": "approve"}]} or [{"type": "reject"}]'
    now = clock.now()
    ttl = policy.approval_ttl_s
    reopen = OpenRequest(
        operation_id=op.operation_id,
        thread_id=op.thread_id,
        tool_call_id=op.tool_call_id,
        tool=op.tool,
        tool_version=op.tool_version,
        args=dict(op.args),
        intent_hash=op.intent_hash,
        budget=op.budget,
    )
    approval = Approval(
        operation_id=op.operation_id,
        thread_id=call.thread_id,
        tool_call_id=call.tool_call_id,
        decision=decisions[0]["type"],
        intent_hash=op.intent_hash,
        reviewer=str(answer.get("reviewer") or policy.reviewer),
        message=decisions[0].get("message"),
        decided_at=now,
        expires_at=now + timedelta(seconds=ttl) if ttl else None,
    )
    ledger.record_review([reopen], [approval])
    return None
