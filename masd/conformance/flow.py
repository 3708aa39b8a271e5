"""Flows as data: the JSON format of ``conformance/flows/<role>/<name>.json``, checked.

A flow is one JSON object (``conformance/flows/flow.schema.json`` is its
schema; ``conformance/README.md`` explains each key)::

    {"name": "intake-acknowledged", "role": "master",
     "covers": ["docs/protocol.md §11.3", "docs/protocol.md §5"],
     "description": "...", "clock": "test", "config": {...},
     "steps": [{"mail": {...}}, {"expect_mail": {...}}, ...]}

:func:`load_flow` turns one file into a frozen :class:`Flow` or raises
:class:`FlowError` naming the key path at fault (``steps[3].expect.within``)
and why.  Beyond the schema it checks what a schema cannot: the name equals
the file's stem, every ``covers`` entry is a clause of :data:`CLAUSES`, a
``tick`` only on the test clock, and every ``${name}`` is defined before it
is used (a built-in, or captured by an earlier step).

This module gathers the format's names: the values are in
:mod:`masd.conformance.steps`, the reading in :mod:`masd.conformance.load`,
the clauses in :mod:`masd.conformance.clauses`.
"""

from __future__ import annotations

from masd.conformance import steps
from masd.conformance.clauses import CLAUSES, Clause
from masd.conformance.load import load_flow, load_flows, parse_flow
from masd.conformance.steps import *  # noqa: F403  (the format's values, as steps.__all__ names them)

__all__ = ["CLAUSES", "Clause", "load_flow", "load_flows", "parse_flow", *steps.__all__]
