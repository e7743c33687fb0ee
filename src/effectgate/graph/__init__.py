"""The agent graph: review interrupt, one node per side effect, ledger-checked dispatch.

This package is the only one that imports LangGraph (a layering rule,
checked by tests/test_import_boundaries.py).
"""

from effectgate.graph._agent import (
    Agent,
    PendingInterrupt,
    RunResult,
    RunStatus,
    check_review_answer,
)
from effectgate.graph._blocks import (
    EffectGate,
    add_effect_nodes,
    ensure_call_ids,
    guard_resumes,
    resume_command,
)
from effectgate.graph._build import AgentParts, build_agent, new_worker_id
from effectgate.graph._history import history_problems
from effectgate.graph._policy import Policy
from effectgate.graph._saver import StepDurableSaver
from effectgate.graph._state import (
    ActionRequest,
    AgentState,
    Decision,
    EditedAction,
    EffectTask,
    ReconciliationRequest,
    ReviewConfig,
    ReviewRequest,
    ReviewResponse,
)

__all__ = [
    "ActionRequest",
    "Agent",
    "AgentParts",
    "AgentState",
    "Decision",
    "EditedAction",
    "EffectGate",
    "EffectTask",
    "PendingInterrupt",
    "Policy",
    "ReconciliationRequest",
    "ReviewConfig",
    "ReviewRequest",
    "ReviewResponse",
    "RunResult",
    "RunStatus",
    "StepDurableSaver",
    "add_effect_nodes",
    "build_agent",
    "check_review_answer",
    "ensure_call_ids",
    "guard_resumes",
    "history_problems",
    "new_worker_id",
    "resume_command",
]
