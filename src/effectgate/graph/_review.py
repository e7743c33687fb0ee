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

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command, interrupt

from effectgate._clock import Clock
from effectgate.answers import (
    RESOLVED,
    bind_shown_flags,
)
from effectgate.errors import ConfigError, DecisionError
from effectgate.graph._messages import (
    pending_calls,
)
from effectgate.graph._policy import Policy
from effectgate.graph._review_decide import _Decided, _record_and_route, parse_decisions
from effectgate.graph._review_prepare import (
    Prepared,
    choose_operation_id,
    prepare_calls,
)
from effectgate.graph._review_resume import (
    ResumeReading,
    _answer_waiting,
    _shown_review,
    goto_end_asked,
    refuse_resume_before_run,
    refuse_unknown_resume,
)
from effectgate.graph._state import (
    AgentState,
    ReviewRequest,
)
from effectgate.ledger import (
    Ledger,
)
from effectgate.tools import ToolSpec

__all__ = [
    "Prepared",
    "choose_operation_id",
    "make_review_node",
    "parse_decisions",
    "prepare_calls",
    "refuse_resume_before_run",
    "refuse_unknown_resume",
]


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
