"""masd as a real process for black-box tests: config files, start, readiness, stop.

The rig itself lives in :mod:`masd.testing` (shared with ``masd demo`` and the
conformance runner); this module gathers what the tests import from it:
``MasdProcess`` (``masd serve`` as a child, ready on ``READY=1``),
``write_master_config`` and ``server_section`` (configurations on free
loopback ports, secrets mode 0600), ``mx_mail`` (mail as our MX hands it
over) and ``wait_until``.
"""

from __future__ import annotations

from pathlib import Path

from masd.testing.config import AUTHSERV_ID as AUTHSERV_ID
from masd.testing.config import DOMAIN as DOMAIN
from masd.testing.config import MasterSetup as MasterSetup
from masd.testing.config import server_section as server_section
from masd.testing.config import write_master_config as write_master_config
from masd.testing.files import write_secret as write_secret
from masd.testing.inbound import mx_mail as mx_mail
from masd.testing.net import free_port as free_port
from masd.testing.process import START_TIMEOUT as START_TIMEOUT
from masd.testing.process import STOP_TIMEOUT as STOP_TIMEOUT
from masd.testing.process import MasdProcess as MasdProcess
from masd.testing.process import MasdStartError as MasdStartError
from masd.testing.wait import WAIT as WAIT
from masd.testing.wait import wait_until as wait_until

ROOT = Path(__file__).resolve().parents[2]
