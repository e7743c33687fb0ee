"""The answer protocol: how a person's answer reaches the call it was given for.

One home for the rules every answer path follows (the review node, the effect
node's verdicts, ``Agent.resume``, the CLI, ``Dispatcher.apply_verdict``):

- **Bound.** A review answer names what it answers: the interrupt id it was
  shown under (``"interrupt_id"``), or, per decision, the ``operation_id``
  and ``intent_hash`` shown. An answer that names nothing is refused with the
  pending reviews listed; it is never guessed onto whatever waits now.
- **Each interrupt on its own.** Several pending interrupts are answered by a
  map from interrupt id to answer, as LangGraph's ``Command(resume={id:
  value})``; a partial map leaves the others pending.
- **Idempotent.** The same answer to a review that is already decided returns
  the recorded outcome; a different one is refused, naming the recorded
  decision, and the refusal is written to the ledger as an event.
- **Verdicts.** One validation (``VerdictModel``, pydantic) on every path;
  a verdict is bound to the attempt it was given for.
- **Follow-ups.** A new human message while calls wait for an answer is
  judged by one rule (``follow_up_plan``) on every path (``Agent.send``, the
  graph's agent node a LangGraph client's new input reaches, the
  middleware's ``before_model``): calls whose operation provably never
  started are closed as superseded (``close_for_follow_up``); anything that
  may have started, or a reconciliation, refuses the message
  (``FollowUpError``).

The raw compiled graph keeps LangGraph's own ``Command(resume=...)`` rules:
these rules bind effectgate's own API and CLI. Imports no LangGraph.
"""

from __future__ import annotations

from effectgate.answers._blanket import BlanketAnswer, blanket_answer
from effectgate.answers._decisions import (
    EDIT_NEEDS,
    RESPOND_NEEDS,
    check_decision_allowed,
    check_decision_count,
    check_review_answer,
    decision_allowed,
    decision_object,
    edited_args,
    respond_text,
    review_decisions,
)
from effectgate.answers._follow_up import (
    Closing,
    OpenCall,
    check_no_orphans,
    close_for_follow_up,
    follow_up_plan,
    never_started,
    orphaned_operations,
    started,
)
from effectgate.answers._resolve import OneAnswerEach, Resolution, resolve
from effectgate.answers._resume import (
    check_resume_ids,
    check_unkeyed_resume,
    is_resume_map,
    refuse_goto_end_without_review,
    refuse_resume_of_idle,
    refuse_resume_of_lost_review,
    refuse_resume_of_step_left,
)
from effectgate.answers._settle import is_decided, recorded_decision, settle_stale
from effectgate.answers._shown_flags import (
    DESCRIPTION_WARNING,
    REVIEW_FLAGS,
    bind_decisions,
    bind_shown_flags,
    description_flags,
    flag_text,
    flags_of,
    new_flags,
    review_description,
)
from effectgate.answers._texts import (
    RESOLVED,
    SUPERSEDED,
    SUPERSEDED_BY,
    AnswerOutcome,
    DecisionKind,
    PendingLike,
    answer_summary,
    as_payload,
    describe_pending,
    pending_line,
    question_text,
)
from effectgate.answers._verdicts import (
    Verdict,
    VerdictModel,
    apply_verdict,
    recorded_verdict,
    settle_verdict,
    validate_verdict,
    verdict_attempt_problem,
)

__all__ = [
    "AnswerOutcome",
    "BlanketAnswer",
    "Closing",
    "DESCRIPTION_WARNING",
    "DecisionKind",
    "EDIT_NEEDS",
    "OneAnswerEach",
    "OpenCall",
    "PendingLike",
    "RESOLVED",
    "RESPOND_NEEDS",
    "REVIEW_FLAGS",
    "Resolution",
    "SUPERSEDED",
    "SUPERSEDED_BY",
    "Verdict",
    "VerdictModel",
    "answer_summary",
    "apply_verdict",
    "as_payload",
    "bind_decisions",
    "bind_shown_flags",
    "blanket_answer",
    "check_decision_allowed",
    "check_decision_count",
    "check_no_orphans",
    "check_resume_ids",
    "check_review_answer",
    "check_unkeyed_resume",
    "close_for_follow_up",
    "decision_allowed",
    "decision_object",
    "describe_pending",
    "description_flags",
    "edited_args",
    "flag_text",
    "flags_of",
    "follow_up_plan",
    "is_decided",
    "is_resume_map",
    "never_started",
    "new_flags",
    "orphaned_operations",
    "pending_line",
    "question_text",
    "recorded_decision",
    "recorded_verdict",
    "refuse_resume_of_idle",
    "refuse_resume_of_lost_review",
    "refuse_goto_end_without_review",
    "refuse_resume_of_step_left",
    "resolve",
    "respond_text",
    "review_decisions",
    "review_description",
    "settle_stale",
    "settle_verdict",
    "started",
    "validate_verdict",
    "verdict_attempt_problem",
]
