"""The operator console's pages: server-rendered HTML of the read side's documents
(docs/operations.md §10, the console).

Nothing here does I/O or imports the rest of masd: each page is a function from the JSON
documents :mod:`masd.read` returns (the bodies of the read side's routes) to HTML text, every
value escaped with :func:`html.escape` (:mod:`masd.console.markup`).  The HTTP routes that
serve them, and the sign-in, are :mod:`masd.edges.http.console`; the sessions it keeps are
:mod:`masd.console.sessions`.

- :mod:`~masd.console.markup`: escaping, the page frame, tables, the forms that change anything
  (each with its CSRF token);
- :mod:`~masd.console.timeline`: a thread entry as one timeline row (the page and the live
  feed render it alike);
- :mod:`~masd.console.pages`: the pages themselves;
- ``static/``: the one style sheet, the one script and the icon, served by masd itself.
"""
