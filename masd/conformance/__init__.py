"""The conformance suite's runner (docs/protocol.md §19).

"conformance/ holds valid and invalid messages, the transition table as
data, and scripted flows. Each flow is a sequence of inbound mail, contract
messages and clock ticks, with the expected email-side reaction. An
email-side implementation claims MAS-MODES-EMAIL-MASTER or
MAS-MODES-EMAIL-SLAVE by passing the flows for that role."

- :mod:`masd.conformance.flow`: the flow format, loaded and checked into
  frozen values (:mod:`~masd.conformance.steps`, read by
  :mod:`~masd.conformance.load`; a malformed flow is a :class:`FlowError`
  naming its path), and the clauses a flow covers
  (:mod:`~masd.conformance.clauses`);
- :mod:`masd.conformance.match`: subset matching, ``${name}`` substitution
  and captures;
- :mod:`masd.conformance.runner`: plays flows against an implementation
  started as a separate process, over real sockets
  (:mod:`~masd.conformance.session` for one flow's run, from the standard
  configuration of :mod:`~masd.conformance.standard`;
  :mod:`~masd.conformance.acts` and :mod:`~masd.conformance.checks` for its
  steps; the fakes and helpers are :mod:`masd.testing`'s);
- :mod:`masd.conformance.coverage`: the clause-to-flow table.

The format and the target contract are documented in ``conformance/README.md``.
"""

from __future__ import annotations

from masd.conformance.flow import CLAUSES, Flow, FlowError, load_flow, load_flows

__all__ = ["CLAUSES", "Flow", "FlowError", "load_flow", "load_flows"]
