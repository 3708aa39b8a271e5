"""The working tree beside an older commit, on the same load, alternated: CPU per mail and rate.

    python -m bench.compare REV [--count N] [--sessions N] [--rounds N] [--paths intake,ack]
                                [--pipelined] [--instructions | --profile DIR]
    make bench-compare REV=0679ee1

REV is taken out of git (``git archive``) into the work directory and run with
the working tree's virtualenv when its ``pyproject.toml`` asks for the same
dependencies; otherwise it gets a virtualenv of its own there (installed once
from PyPI).  Each round starts each build on a fresh store, sends it a warm-up
and then ``--count`` mails over ``--sessions`` LMTP sessions from one client,
and reads masd's own CPU time from /proc (the process and its children).  The
builds take turns within a round and the first of them changes every round, so
a drift of the machine (another load, a frequency change) falls on both.

Paths:

- ``intake``: unauthenticated mail to ``ticket@D`` (a case opened, no mail out);
- ``ack``: authenticated mail, each case's acknowledgement sent to a mail sink
  on loopback (the CPU counted until the last acknowledgement arrived).

``--pipelined``: the LMTP client writes ``MAIL``, ``RCPT`` and ``DATA`` together and
then reads their replies, as Postfix's LMTP client does with a server that offers
``PIPELINING``; without it, one command at a time (the figures before 2026-12-04).

``--instructions``: masd runs under valgrind's callgrind, instrumented for the measured pass
only, and each pass prints the instructions masd's threads executed per mail in user space.
The count is the same for the same work (two runs of one build on the intake path: 2,359 and
2,348 thousand a mail), where CPU time on a shared machine is not, so a change of one per cent
shows; the kernel's share (system calls, context switches) is not in it.  One round is
enough; a pass is some 30 times slower.

``--profile DIR`` records each measured pass with py-spy (the same sampling
as ``make bench``'s profiles) so the two builds' profiles of one load can be
read side by side.  The figures are printed, medians last, with the ratio working tree / REV; a
ratio over 1 is CPU the change costs.  Each median comes with the range of its passes, and the
ratio with the range of each round's own ratio: one that range holds 1.00 in may be noise.  On
a shared two-core machine one pass's CPU per mail can be half or twice the next pass's of the
same build (how many jobs each commit takes varies with the scheduling of five processes on
two cores), and the ratio of two runs' medians of the same pair differed by as much as 0.16
(0.85x, then 1.01x); a change of a few per cent shows in counts (statements per mail, round
trips, microbenchmarks), not here.  Nothing is asserted about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

from bench import acks
from bench import masd_setup as masd
from bench.common import PYTHON, ROOT, BenchError, Server, free_port, wait_port
from bench.lmtp_load import latency_run
from bench.run import Profiler

PATHS = ("intake", "ack")
WARM_UP = 50
#: On a shared two-core machine one pass's CPU per mail can be half or twice the next
#: pass's of the same build: three rounds' medians move by a fifth, nine rounds' by less.
ROUNDS = 9
#: Seconds a pass's mails may take to be stored, and their acknowledgements to arrive.
STORED_TIMEOUT = 60.0
ARRIVED_TIMEOUT = 120.0


@dataclass(frozen=True)
class Point:
    path: str
    build: str
    round: int
    rate: float  # mails per second over the pass
    cpu_ms: float  # masd's CPU per mail
    system_ms: float = 0.0  # of which in the kernel
    switches: float = 0.0  # context switches of masd's threads per mail
    instructions: float = 0.0  # under callgrind (--instructions): masd's instructions per mail


def say(text: str) -> None:
    print(text, flush=True)


def _dependencies(pyproject: bytes) -> list[str]:
    return sorted(tomllib.loads(pyproject.decode())["project"]["dependencies"])


def older_build(rev: str, workdir: Path) -> masd.Build:
    """REV's tree below ``workdir`` (once per commit) and an interpreter with its dependencies."""
    try:
        sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}").decode().strip()
    except subprocess.CalledProcessError as exc:
        raise BenchError(f"{rev!r} is not a commit of {ROOT}") from exc
    tree = workdir / f"build-{sha[:12]}"
    if not (tree / "masd").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=BytesIO(_git("archive", sha)), mode="r:") as tar:
            tar.extractall(tree, filter="data")
    mine = (ROOT / "pyproject.toml").read_bytes()
    theirs = (tree / "pyproject.toml").read_bytes()
    if _dependencies(mine) == _dependencies(theirs):
        return masd.Build(rev, tree)
    venv = tree / ".venv"
    python = venv / "bin" / "python"
    if not python.exists():
        say(f"{rev}: other dependencies than the working tree's; a virtualenv in {venv}")
        subprocess.run([PYTHON, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(tree)], check=True)
    return masd.Build(rev, tree, str(python))


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True).stdout


def _which(build: masd.Build) -> str:
    """Where ``build``'s interpreter finds masd (checked, so a run never measures the wrong one)."""
    out = subprocess.run(
        [build.python, "-c", "import masd; print(masd.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=build.tree,
        env={**os.environ, **build.env()},
    ).stdout.strip()
    if not Path(out).resolve().is_relative_to(build.tree.resolve()):
        raise BenchError(f"{build.name}: masd imported from {out}, not from {build.tree}")
    return out


def _stored_at_least(database: Path, n: int, timeout: float = STORED_TIMEOUT) -> None:
    until = time.monotonic() + timeout
    while masd.counts(database)["messages"] < n:
        if time.monotonic() > until:
            raise BenchError(f"fewer than {n} messages stored within {timeout:g} s")
        time.sleep(0.1)


def _pass(
    port: int, sessions: int, count: int, tag: str, authenticated: bool, pipelined: bool
) -> float:
    rcpt = f"ticket@{masd.DOMAIN}"
    began = time.perf_counter()
    lat = asyncio.run(
        latency_run(
            port,
            sessions,
            count,
            lambda _: rcpt,
            tag=tag,
            authenticated=authenticated,
            pipelined=pipelined,
        )
    )
    if lat.accepted != lat.sent:
        raise BenchError(f"{lat.sent - lat.accepted} of {lat.sent} not accepted: {lat.replies}")
    return time.perf_counter() - began


@contextlib.contextmanager
def peers(path: str, work: Path) -> Iterator[tuple[masd.MasdSetup, acks.Relay | None]]:
    """``work`` with masd's configuration, its contract sink and, on ``ack``, its mail relay."""
    work.mkdir(parents=True)
    port = free_port()
    sink = Server.spawn(
        "sink", [PYTHON, "-m", "bench.http_sink", str(port)], work / "sink.log", port
    )
    relay = acks.start_relay(work) if path == "ack" else None
    try:
        wait_port(port, proc=sink.proc)
        relay_port = relay.server.port if relay else None
        yield masd.write_config(work, sink_port=port, relay_port=relay_port), relay
    finally:
        sink.stop()
        if relay is not None:
            relay.server.stop()


def landed(
    setup: masd.MasdSetup, relay: acks.Relay | None, n: int, timeout: float | None = None
) -> None:
    """Wait until ``n`` mails are stored and, with a relay, ``n`` acknowledgements arrived
    (``timeout``: seconds for each, instead of :data:`STORED_TIMEOUT` and
    :data:`ARRIVED_TIMEOUT`)."""
    _stored_at_least(setup.database, n, timeout or STORED_TIMEOUT)
    if relay is not None:
        _arrived_at_least(relay, n, timeout or ARRIVED_TIMEOUT)


def measure(
    build: masd.Build,
    path: str,
    work: Path,
    *,
    count: int,
    sessions: int,
    round_: int,
    profile: Path | None = None,
    pipelined: bool = False,
    instructions: bool = False,
) -> Point:
    """One build on one path: a fresh store, a warm-up, then the measured pass (``instructions``:
    masd under callgrind, counting the measured pass only)."""
    counted = work / "callgrind.out"
    wrap = [*CALLGRIND, f"--callgrind-out-file={counted}"] if instructions else []
    wait = INSTRUCTIONS_TIMEOUT if instructions else None
    with peers(path, work) as (setup, relay):
        server, _ = masd.start(setup, work / "masd.log", build=build, wrap=wrap)
        try:
            authenticated = path == "ack"
            _pass(setup.lmtp_port, sessions, WARM_UP, f"warm-{round_}", authenticated, pipelined)
            landed(setup, relay, WARM_UP, wait)
            cpu, system, switched = server.cpu(), server.system(), server.switches()
            if instructions:
                _callgrind(server.pid, "on")
            with Profiler(profile, f"{path}-{_slug(build)}-r{round_}", server.pid):
                tag = f"run-{round_}"
                seconds = _pass(setup.lmtp_port, sessions, count, tag, authenticated, pipelined)
                landed(setup, relay, WARM_UP + count, wait)
            if instructions:
                _callgrind(server.pid, "off")
            cpu, system = server.cpu() - cpu, server.system() - system
            switched = server.switches() - switched
        finally:
            code = server.stop()
        if code != 0:
            raise BenchError(f"{build.name} exited {code} on SIGTERM:\n{server.tail()}")
    return Point(
        path,
        build.name,
        round_,
        count / seconds,
        1000 * cpu / count,
        1000 * system / count,
        switched / count,
        _instructions(counted) / count if instructions else 0.0,
    )


#: masd under callgrind, instrumented only while :func:`_callgrind` says so: it counts the
#: instructions masd's threads execute in user space, the same for the same work whatever
#: else the machine is doing (the kernel's share is not counted).
CALLGRIND = ("valgrind", "--tool=callgrind", "--instr-atstart=no")
#: Seconds to wait for a pass's mails under callgrind (some 30 times slower).
INSTRUCTIONS_TIMEOUT = 900.0


def _callgrind(pid: int, state: str) -> None:
    done = subprocess.run(["callgrind_control", "-i", state, str(pid)], capture_output=True)
    if done.returncode != 0:
        raise BenchError(f"callgrind_control -i {state} {pid}: {done.stderr.decode().strip()}")


def _instructions(counted: Path) -> float:
    """The instructions callgrind counted in ``counted`` (its ``totals:`` line)."""
    for line in counted.read_text().splitlines():
        if line.startswith("totals:"):
            return float(line.split()[1])
    raise BenchError(f"{counted}: no totals line (did masd run under callgrind?)")


def _arrived_at_least(relay: acks.Relay, n: int, timeout: float = ARRIVED_TIMEOUT) -> None:
    until = time.monotonic() + timeout
    while len(acks.arrivals(relay.arrivals)) < n:
        if time.monotonic() > until:
            raise BenchError(f"fewer than {n} acknowledgements at the sink within {timeout:g} s")
        time.sleep(0.1)


def run(
    builds: Sequence[masd.Build],
    paths: Sequence[str],
    *,
    count: int,
    sessions: int,
    rounds: int,
    workdir: Path,
    profile: Path | None = None,
    out: Callable[[str], None] = say,
    pipelined: bool = False,
    instructions: bool = False,
) -> list[Point]:
    points: list[Point] = []
    for round_ in range(1, rounds + 1):
        order = builds if round_ % 2 else list(reversed(builds))
        for path in paths:
            for build in order:
                work = workdir / f"r{round_}-{path}-{_slug(build)}"
                p = measure(
                    build,
                    path,
                    work,
                    count=count,
                    sessions=sessions,
                    round_=round_,
                    profile=profile,
                    pipelined=pipelined,
                    instructions=instructions,
                )
                points.append(p)
                out(_line(round_, path, build.name, p))
    return points


def _line(round_: int, path: str, name: str, p: Point) -> str:
    head = f"  round {round_} {path:<6} {name:<14}"
    if p.instructions:  # rate and CPU under callgrind measure callgrind
        return f"{head} {p.instructions / 1000:10.1f} k instructions/mail"
    return (
        f"{head} {p.rate:8.1f} mails/s  {p.cpu_ms:6.3f} ms CPU/mail"
        f" ({p.system_ms:5.3f} in the kernel)  {p.switches:5.1f} context switches/mail"
    )


def _slug(build: masd.Build) -> str:
    return "".join(c if c.isalnum() else "-" for c in build.name)


def summary(points: Sequence[Point], new: str, old: str) -> list[str]:
    """Medians per build, each with the range of its passes, then the ratio of the medians
    and the range of the ratios of the two passes of each round (taken one after the
    other, so a drift of the machine falls on both): a ratio that range holds 1.00 in
    may be noise.  Under callgrind, instructions per mail instead of rate and CPU."""
    if any(p.instructions for p in points):
        return _instruction_summary(points, new, old)
    head = f"{'path':<7} {'build':<14} {'mails/s':>9} {'ms CPU/mail':>12}  (medians; passes' range)"
    lines = [head]
    for path in dict.fromkeys(p.path for p in points):
        med = {}
        for name in (new, old):
            mine = [p for p in points if p.path == path and p.build == name]
            cpu = [p.cpu_ms for p in mine]
            med[name] = (statistics.median(p.rate for p in mine), statistics.median(cpu))
            lines.append(
                f"{path:<7} {name:<14} {med[name][0]:9.1f} {med[name][1]:12.3f}"
                f"  ({min(cpu):.3f}-{max(cpu):.3f})"
            )
        rate, cpu_ratio = med[new][0] / med[old][0], med[new][1] / med[old][1]
        pairs = _round_ratios(points, path, new, old)
        lines.append(
            f"{path:<7} {'ratio':<14} {rate:8.2f}x {cpu_ratio:11.2f}x"
            f"  ({new} / {old}; CPU over 1.00x is CPU the change costs;"
            f" CPU ratio of each round {min(pairs):.2f}-{max(pairs):.2f}x)"
        )
    return lines


def _instruction_summary(points: Sequence[Point], new: str, old: str) -> list[str]:
    lines = [f"{'path':<7} {'build':<14} {'k instructions/mail':>20}  (medians; passes' range)"]
    for path in dict.fromkeys(p.path for p in points):
        med = {}
        for name in (new, old):
            counts = [p.instructions / 1000 for p in points if p.path == path and p.build == name]
            med[name] = statistics.median(counts)
            lines.append(
                f"{path:<7} {name:<14} {med[name]:20.1f}  ({min(counts):.1f}-{max(counts):.1f})"
            )
        lines.append(
            f"{path:<7} {'ratio':<14} {med[new] / med[old]:19.3f}x"
            f"  ({new} / {old}; over 1.000x is work the change adds)"
        )
    return lines


def _round_ratios(points: Sequence[Point], path: str, new: str, old: str) -> list[float]:
    """CPU per mail of ``new`` over ``old`` in each round of ``path``."""
    cpu = {(p.round, p.build): p.cpu_ms for p in points if p.path == path}
    rounds = sorted({r for r, _ in cpu})
    return [cpu[r, new] / cpu[r, old] for r in rounds if (r, new) in cpu and (r, old) in cpu]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.compare", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("rev", help="the older commit (a tag, a hash, HEAD~3)")
    ap.add_argument("--count", type=int, default=1000, help="mails per pass (default 1000)")
    ap.add_argument("--sessions", type=int, default=8, help="LMTP sessions (default 8)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help=f"rounds of alternation (default {ROUNDS}: one pass alone is noisy)",
    )
    ap.add_argument("--paths", default=",".join(PATHS), help="intake,ack (default both)")
    ap.add_argument("--workdir", type=Path, help="default: a new directory in /var/tmp")
    ap.add_argument(
        "--pipelined",
        action="store_true",
        help="the LMTP client writes MAIL, RCPT and DATA together, as Postfix's does",
    )
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="run masd under valgrind's callgrind and count its instructions per mail"
        " (the same for the same work, some 30 times slower; one round is enough)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="py-spy profiles of every measured pass into DIR (bench/requirements.txt),"
        " each with its summary (python -m bench.profile)",
    )
    args = ap.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(args.paths) - set(PATHS))
    if unknown:
        ap.error(f"--paths: {', '.join(unknown)} not one of {', '.join(PATHS)}")
    if args.instructions and args.profile:
        ap.error("--instructions and --profile: py-spy cannot read a process under valgrind")
    if min(args.count, args.sessions, args.rounds) < 1:
        ap.error("--count, --sessions and --rounds are at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.instructions and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        say("bench.compare: --instructions needs valgrind (Debian's package valgrind)")
        return 1
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="masd-compare-", dir="/var/tmp"))
    try:
        old = older_build(args.rev, workdir)
        new = masd.Build("working tree", ROOT)
        for build in (new, old):
            say(f"{build.name}: masd from {_which(build)}")
        points = run(
            [new, old],
            args.paths,
            count=args.count,
            sessions=args.sessions,
            rounds=args.rounds,
            workdir=workdir / f"run-{int(time.time())}",
            profile=args.profile,
            pipelined=args.pipelined,
            instructions=args.instructions,
        )
    except BenchError as exc:
        say(f"bench.compare: {exc}")
        return 1
    say("")
    for line in summary(points, new.name, old.name):
        say(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
