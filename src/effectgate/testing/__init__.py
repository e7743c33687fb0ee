"""Public test affordances: a fake clock, the oracle, the ledger conformance suite.

Submodules (imported on demand, so this package stays light):
``effectgate.testing.oracle`` (what the external systems hold),
``effectgate.testing.worker`` (a killable worker process),
``effectgate.testing.ledger_conformance`` (the suite every ledger store must pass),
``effectgate.testing.openai_server`` (a local OpenAI-compatible server),
``effectgate.testing.langgraph_dev`` (``langgraph dev`` serving the agent, started and stopped),
``effectgate.testing.campaign`` (the kill campaign).
"""

from effectgate._clock import FakeClock

__all__ = ["FakeClock"]
