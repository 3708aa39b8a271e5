"""masd's benchmarks: ``make bench`` (full run) and ``make bench-smoke`` (tiny counts).

Everything runs on loopback, every loop is bounded in count or time, and
every server started here is stopped here.  See ``bench/run.py`` and
``docs/performance.md``; ``python -m bench.feed`` measures intake under event-feed
followers.
"""
