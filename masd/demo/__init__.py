"""``masd demo``: masd on loopback, first as the master of its cases, then as a slave.

Everything runs in one process and one event loop: masd itself
(:class:`masd.app.App` with a configuration written to a temporary
directory), its peers on loopback, and an SMTP sink standing in for the
outbound relay (:mod:`masd.demo.rig`).  The demo delivers mail over LMTP,
the way Postfix would, waits until every flow has settled and prints each
case's thread as masd recorded it (read through :mod:`masd.read.case_views`).

- Master part (:mod:`masd.demo.master`): type ``ticket`` in the master role
  with a demo mode endpoint, a callback service that "calls" the
  participant: a new case, a callback with the phone number in the mail, a
  callback that needs negotiation, a mode with no endpoint, and automated
  mail that is never answered.
- Slave part (:mod:`masd.demo.slave`): type ``case`` in the slave role under
  a demo CRM that names the cases (``case.assign``), answers mail
  (``mail.send``) and turns one case's transfers to the callback service,
  whose statuses masd relays back to it in order.

Its lines come in the same order on every run (:mod:`masd.demo.stage`).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from masd.demo.master import run_master
from masd.demo.rig import DemoRig
from masd.demo.slave import run_slave

__all__ = ["main", "run_demo"]


async def run_demo(out: TextIO) -> int:
    """Run the demo, writing to ``out``; 0 when every flow settled, else 1."""
    with tempfile.TemporaryDirectory(prefix="masd-demo-") as tmp:
        rig = DemoRig(out, Path(tmp))
        try:
            await rig.start()
            master_part = await run_master(rig)
            slave_part = await run_slave(rig)
            return master_part or slave_part
        finally:
            await rig.stop()


def main() -> int:
    """Entry point of ``masd demo``."""
    return asyncio.run(run_demo(sys.stdout))
