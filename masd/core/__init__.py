"""The pure core of masd: no I/O, no event loop, no database.

Everything here is a function from values to values: address parsing, the
gateway event and its trust rules, the handoff status machine, Principle 10
decisions and the role engines.  The edges (``masd.edges``) and the store
(``masd.store``) feed it inputs and carry out the effects it returns.
"""
