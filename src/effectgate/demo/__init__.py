"""The demo's external systems: a ticket service and a mail sink on loopback.

They stand in for the outside world: real
servers in their own processes with their own SQLite files, so that "did it
happen?" is answered by their storage and never by effectgate's own code.
Start them with ``DemoServices``; read their storage with ``read_tickets`` and
``read_mails``; inject faults with ``DemoServices.set_fault`` (``FaultMode``).
"""

from effectgate.demo._faults import FaultMode
from effectgate.demo.services import DemoServices, ServiceEndpoints, read_mails, read_tickets

FaultMode.__module__ = "effectgate.demo"

__all__ = ["DemoServices", "FaultMode", "ServiceEndpoints", "read_mails", "read_tickets"]
