"""Python calls per mail on masd's event loop, by function: exact, whatever the machine's load.

    python -m bench.calls [REV] [--paths intake,ack] [--small 200] [--large 700] [--top 30]

Each build (the working tree, and REV beside it when given) is run under
cProfile twice per path on a fresh store, once for ``--small`` and once for
``--large`` mails over 8 LMTP sessions (as :mod:`bench.compare` sends them);
the difference of the two runs divided by the difference of the counts is
what one more mail costs, start-up and shut-down cancelled out.  Call counts
are exact (the same load gives the same counts on a busy machine); the
times next to them are cProfile's and as noisy as the machine.  cProfile
sees the thread it was started in, the event loop: the store's writer
thread is not counted (``bench.compare --profile`` samples every thread).
Nothing is asserted; the figures are printed, the working tree's first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pstats
import re
import signal
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from tempfile import mkdtemp

from bench import masd_setup as masd
from bench.common import ROOT, BenchError, Server, wait_port
from bench.compare import PATHS, landed, older_build, peers
from bench.lmtp_load import latency_run

Counts = dict[str, tuple[float, float]]  # function -> (calls, microseconds)

_PROFILED = (
    "import cProfile, runpy, sys\n"
    "sys.argv = ['masd', 'serve', '--config', {config!r}]\n"
    'cProfile.run(\'runpy.run_module("masd", run_name="__main__")\', {out!r})\n'
)


def profiled_run(build: masd.Build, path: str, work: Path, n: int) -> Counts:
    """``n`` mails on ``path`` to ``build`` under cProfile: calls and time by function."""
    with peers(path, work) as (setup, relay):
        out = work / "prof.out"
        code = _PROFILED.format(config=str(setup.config), out=str(out))
        srv = Server.spawn(
            "masd",
            [build.python, "-c", code],
            work / "masd.log",
            setup.lmtp_port,
            env=build.env(),
            cwd=build.tree,
        )
        wait_port(setup.lmtp_port, timeout=60, proc=srv.proc)
        rcpt = f"ticket@{masd.DOMAIN}"
        auth = relay is not None
        try:
            lat = asyncio.run(
                latency_run(setup.lmtp_port, 8, n, lambda _: rcpt, tag="c", authenticated=auth)
            )
            if lat.accepted != lat.sent:
                raise BenchError(f"{lat.sent - lat.accepted} of {lat.sent} not accepted")
            landed(setup, relay, n)
            time.sleep(0.5)
        finally:
            srv.proc.send_signal(signal.SIGTERM)
            srv.proc.wait(60)
    return _by_function(out, build.tree)


def _by_function(out: Path, tree: Path) -> Counts:
    found: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    stats = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    for (filename, _line, name), (_cc, calls, tottime, _ct, _callers) in stats.items():
        where = filename.split("site-packages/")[-1].replace(str(tree) + "/", "")
        where = re.sub(r".*/lib/python3\.\d+/", "", where)
        name = re.sub(r" at 0x[0-9a-f]+", "", name)  # built-ins' addresses differ per run
        key = f"{name} ({where})"
        found[key][0] += calls
        found[key][1] += tottime * 1e6
    return {k: (v[0], v[1]) for k, v in found.items()}


def per_mail(small: Counts, large: Counts, n: int) -> Counts:
    keys = set(small) | set(large)
    zero = (0.0, 0.0)
    return {
        k: (
            (large.get(k, zero)[0] - small.get(k, zero)[0]) / n,
            (large.get(k, zero)[1] - small.get(k, zero)[1]) / n,
        )
        for k in keys
    }


def report(new: Counts, old: Counts | None, *, top: int) -> list[str]:
    total = sum(v[0] for v in new.values())
    lines = [f"calls per mail: {total:.0f}"]
    if old:
        lines[0] += f" (the other build: {sum(v[0] for v in old.values()):.0f})"
    base = old or {}
    zero = (0.0, 0.0)

    def moved(k: str) -> float:
        return -abs(new.get(k, zero)[0] - base.get(k, zero)[0])

    keys = sorted(set(new) | set(base), key=moved) if old else sorted(new, key=lambda k: -new[k][0])
    for k in keys[:top]:
        n, o = new.get(k, zero), base.get(k, zero)
        if old is None:
            lines.append(f"  {n[0]:7.1f}  {n[1]:7.1f} us  {k}")
        elif abs(n[0] - o[0]) >= 0.5:
            lines.append(f"  {n[0] - o[0]:+7.1f}  {n[0]:7.1f} vs {o[0]:7.1f}  {k}")
    return lines


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.calls", description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", nargs="?", help="an older commit to count beside the working tree")
    ap.add_argument("--paths", default=",".join(PATHS), help="intake,ack (default both)")
    ap.add_argument("--small", type=int, default=200, help="mails of the first run (200)")
    ap.add_argument("--large", type=int, default=700, help="mails of the second run (700)")
    ap.add_argument("--top", type=int, default=30, help="functions listed (30)")
    ap.add_argument("--workdir", type=Path, help="default: a new directory in /var/tmp")
    args = ap.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(args.paths) - set(PATHS))
    if unknown:
        ap.error(f"--paths: {', '.join(unknown)} not one of {', '.join(PATHS)}")
    if not 1 <= args.small < args.large:
        ap.error(f"--small {args.small} and --large {args.large}: 1 <= small < large")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    workdir = args.workdir or Path(mkdtemp(prefix="masd-calls-", dir="/var/tmp"))
    try:
        builds = [masd.Build("working tree", ROOT)]
        if args.rev:
            builds.append(older_build(args.rev, workdir))
        for path in args.paths:
            counts: list[Counts] = []
            for i, build in enumerate(builds):
                small = profiled_run(build, path, workdir / f"{path}-{i}-small", args.small)
                large = profiled_run(build, path, workdir / f"{path}-{i}-large", args.large)
                counts.append(per_mail(small, large, args.large - args.small))
                (workdir / f"{path}-{i}.json").write_text(json.dumps(counts[-1]))
            against = f" against {builds[1].name}" if args.rev else ""
            print(f"== {path}: {builds[0].name}{against}")
            for line in report(counts[0], counts[1] if args.rev else None, top=args.top):
                print(line, flush=True)
    except BenchError as exc:
        print(f"bench.calls: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
