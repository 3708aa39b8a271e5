"""Test doubles of masd's peers, on real loopback sockets.

Used by masd's own tests, ``masd demo`` and the conformance runner: a mode
endpoint or master (:class:`~masd.testing.peers.FakePeer`, HTTP) and a mail
relay (:class:`~masd.testing.peers.SmtpSink`, SMTP); and, for unit tests, a mail
transport that keeps mail in memory (:class:`~masd.testing.mail.MemoryMailTransport`).
"""

from masd.testing.mail import MemoryMailTransport
from masd.testing.peers import Answer, FakePeer, ReceivedMail, Recorded, SmtpSink

__all__ = ["Answer", "FakePeer", "MemoryMailTransport", "ReceivedMail", "Recorded", "SmtpSink"]
