"""The test rig: masd's peers faked on real loopback sockets, and the helpers around them.

Used by masd's own tests, ``masd demo`` and the conformance runner alike:

- :mod:`~masd.testing.peers`: a mode endpoint, master or webhook
  (:class:`FakePeer`, HTTP) and the mail relay (:class:`SmtpSink`, SMTP);
- :mod:`~masd.testing.mail`: a mail transport that keeps mail in memory
  (:class:`MemoryMailTransport`), for unit tests;
- :mod:`~masd.testing.config`, :mod:`~masd.testing.files`: configurations
  and secret files on free ports (:mod:`~masd.testing.net`);
- :mod:`~masd.testing.inbound`: mail as our MX hands it to masd;
- :mod:`~masd.testing.client`: masd's HTTP listener as a peer or operator uses it;
- :mod:`~masd.testing.process`: masd (or any target) as a child process;
- :mod:`~masd.testing.wait`: bounded waits;
- :mod:`~masd.testing.postgres`: a private PostgreSQL server on loopback (needs the
  ``postgresql`` extra and Debian's ``postgresql`` package).
"""

from masd.testing.mail import MemoryMailTransport
from masd.testing.peers import Answer, FakePeer, ReceivedMail, Recorded, SmtpSink

__all__ = ["Answer", "FakePeer", "MemoryMailTransport", "ReceivedMail", "Recorded", "SmtpSink"]
