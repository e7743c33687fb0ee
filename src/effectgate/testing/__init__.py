"""Public test affordances: a fake clock, the failpoints, the oracle, the ledger conformance suite.

``FakeClock`` is a clock a test moves by hand; ``Failpoint`` names the seams
where ``EFFECTGATE_FAILPOINT`` kills a process on purpose, so that a test of
your own tool can kill it, for example, right after its external commit
(``EFFECTGATE_FAILPOINT=AFTER_EXTERNAL_COMMIT@my_tool``), and check in the
external system that the effect happened once after a new process resumed
the thread. The killed process exits with ``effectgate.cli.ExitCode.KILLED``
(137); docs/custom-tools.md shows the steps.

Submodules (imported on demand, so this package stays light):
``effectgate.testing.oracle`` (what the external systems hold),
``effectgate.testing.worker`` (a killable worker process),
``effectgate.testing.ledger_conformance`` (the suite every ledger store must pass),
``effectgate.testing.openai_server`` (a local OpenAI-compatible server),
``effectgate.testing.langgraph_dev`` (``langgraph dev`` serving the agent, started and stopped),
``effectgate.testing.campaign`` (the kill campaign).
"""

from effectgate._clock import FakeClock
from effectgate._failpoints import Failpoint

__all__ = ["Failpoint", "FakeClock"]
