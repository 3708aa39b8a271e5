"""Play flows against an implementation running as a separate process.

For each flow: start the fake peers and the SMTP relay sink on loopback,
write the standard configuration (patched by the flow's ``config``), start
the target (``<python> -m masd serve`` by default) with ``--config FILE``
(and ``--test-clock`` for a test-clock flow), wait until ``GET /healthz``
answers 200, play the steps over real sockets, then stop the target with
SIGTERM (it must exit 0).  One fresh process and store per flow
(:mod:`masd.conformance.session`).

Contract messages the target sends are *held* by the fake peer until an
``expect`` step claims them and gives the peer's answer, so a flow decides
every answer (200, 4xx, 5xx, or hold until a ``release``).  The run is
strict: a contract message or a mail that no step claimed is a failure.
Each kind of step has its handler (:mod:`masd.conformance.acts` for the
steps that act, :mod:`masd.conformance.checks` for those that check),
chosen from :data:`HANDLERS` by the step's kind.

Output: one line per flow, ``PASS name`` or ``FAIL name: step N (kind):
what differed``, and last ``N passed, M failed``.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

import httpx

from masd.conformance import acts, checks
from masd.conformance.databases import FlowDatabases
from masd.conformance.match import MatchError
from masd.conformance.session import FlowRun, StepFailure
from masd.conformance.standard import DOMAIN, apply_patch, standard_config
from masd.conformance.steps import Flow
from masd.testing import lmtpclient
from masd.testing.files import to_toml
from masd.testing.process import child_env, reap_all

__all__ = [
    "DOMAIN",
    "HANDLERS",
    "FlowResult",
    "Target",
    "apply_patch",
    "command",
    "run",
    "run_flow",
    "run_flows",
    "standard_config",
    "to_toml",
]

#: After the last step, how long stray messages may still arrive and be caught.
SETTLE: Final = 0.2

Handler = Callable[[FlowRun, Any], Awaitable[None]]
#: The handler of each kind of step (the key that names the step in a flow file).
HANDLERS: Final[dict[str, Handler]] = {
    "mail": acts.mail,
    "post": acts.post,
    "tick": acts.tick,
    "restart": acts.restart,
    "relay": acts.relay,
    "expect": checks.expect,
    "release": checks.release,
    "expect_mail": checks.expect_mail,
    "expect_nothing": checks.nothing,
    "read": checks.read,
}


@dataclass(frozen=True)
class Target:
    """The command line of the implementation under test (``--config FILE`` is appended).

    ``default`` marks masd itself, run from this interpreter: its package
    directory goes first on the child's ``PYTHONPATH``.
    """

    argv: tuple[str, ...]
    default: bool = False

    @classmethod
    def masd(cls) -> Target:
        return cls((sys.executable, "-m", "masd", "serve"), default=True)

    @classmethod
    def parse(cls, command: str | None) -> Target:
        if not command:
            return cls.masd()
        argv = tuple(shlex.split(command))
        if not argv:
            raise ValueError("--target: an empty command")
        return cls(argv)


@dataclass(frozen=True)
class FlowResult:
    name: str
    ok: bool
    detail: str = ""
    log: Path | None = None

    def line(self) -> str:
        return f"PASS {self.name}" if self.ok else f"FAIL {self.name}: {self.detail}"


async def play(run: FlowRun) -> None:
    """Every step in turn, then nothing may be left unclaimed."""
    for i, step in enumerate(run.flow.steps, start=1):
        try:
            await HANDLERS[step.kind](run, step.action)
        except StepFailure as exc:
            raise StepFailure(f"step {i} ({step.kind}): {exc.detail}") from None
        except (lmtpclient.LmtpError, httpx.HTTPError, OSError, MatchError) as exc:
            raise StepFailure(f"step {i} ({step.kind}): {type(exc).__name__}: {exc}") from None
    await asyncio.sleep(SETTLE)
    left = run.leftovers()
    if left:
        raise StepFailure(f"after the last step: unexpected {left}")


async def run_flow(
    flow: Flow, target: Target, workdir: Path, databases: FlowDatabases | None = None
) -> FlowResult:
    """One flow, one fresh target (and store); never raises for what the target does."""
    databases = databases or FlowDatabases()
    name = await asyncio.to_thread(databases.fresh)
    env = child_env(this_masd=target.default)
    keys, secrets = databases.server_keys(name), databases.secrets()
    run = FlowRun(flow, target.argv, env, workdir, keys, secrets)
    log = workdir / "target.log"
    failure: str | None = None
    try:
        await run.setup()
        await play(run)
    except StepFailure as exc:
        failure = exc.detail
    except (lmtpclient.LmtpError, httpx.HTTPError, OSError) as exc:
        failure = f"{type(exc).__name__}: {exc}"
    finally:
        code = await run.teardown()
        await asyncio.to_thread(databases.drop, name)
    if failure is None and code not in (0, None):
        failure = f"after the last step: the target exited with {code} on SIGTERM, not 0"
    if failure is not None:
        return FlowResult(flow.name, False, _first(failure), log)
    return FlowResult(flow.name, True, log=log)


def _first(text: str, limit: int = 600) -> str:
    """One line, at most ``limit`` characters, keeping the start (the step and the field)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit] + "…"


async def run_flows(
    flows: Sequence[Flow],
    target: Target,
    out: TextIO,
    *,
    keep: Path | None = None,
    verbose: bool = False,
    databases: FlowDatabases | None = None,
) -> list[FlowResult]:
    """Every flow in turn; prints one line each and the summary line."""
    results: list[FlowResult] = []
    base = Path(tempfile.mkdtemp(prefix="masd-conf-")) if keep is None else keep
    base.mkdir(parents=True, exist_ok=True)
    try:
        for flow in flows:
            workdir = base / f"{flow.role}-{flow.name}"
            shutil.rmtree(workdir, ignore_errors=True)
            workdir.mkdir(parents=True)
            result = await run_flow(flow, target, workdir, databases)
            results.append(result)
            print(result.line(), file=out, flush=True)
            if verbose and not result.ok and result.log is not None:
                print("    " + _tail(result.log).replace("\n", "\n    "), file=out, flush=True)
    finally:
        if keep is None:
            shutil.rmtree(base, ignore_errors=True)
    passed = sum(r.ok for r in results)
    print(f"{passed} passed, {len(results) - passed} failed", file=out, flush=True)
    return results


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run(
    flows: Sequence[Flow],
    target: Target,
    out: TextIO,
    *,
    keep: Path | None = None,
    verbose: bool = False,
    databases: FlowDatabases | None = None,
) -> int:
    """Run the flows; exit status 0 only when every one passes."""
    try:
        results = asyncio.run(
            run_flows(flows, target, out, keep=keep, verbose=verbose, databases=databases)
        )
    finally:
        reap_all()  # interrupted: no target outlives the run
    return 0 if results and all(r.ok for r in results) else 1


def command(
    *,
    role: str | None,
    names: Sequence[str],
    target: str | None,
    flows_dir: Path | None,
    keep: Path | None,
    verbose: bool,
    out: TextIO,
    err: TextIO,
    databases: FlowDatabases | None = None,
) -> int:
    """``masd conformance run``: 0 all passed, 1 a flow failed, 2 nothing to run or a bad flow.

    ``databases``: each flow's store (default: its own SQLite file)."""
    from masd._resources import conformance_dir
    from masd.conformance.flow import FlowError, load_flows

    folder = flows_dir or conformance_dir() / "flows"
    try:
        flows = load_flows(folder, role)
        chosen = Target.parse(target)
    except (FlowError, ValueError) as exc:
        print(f"masd: {exc}", file=err)
        return 2
    if names:
        known = {f.name for f in flows}
        unknown = [n for n in names if n not in known]
        if unknown:
            print(f"masd: no flow {unknown[0]!r} in {folder}", file=err)
            return 2
        flows = [f for f in flows if f.name in names]
    if not flows:
        print(f"masd: no flows under {folder}" + (f"/{role}" if role else ""), file=err)
        return 2
    return run(flows, chosen, out, keep=keep, verbose=verbose, databases=databases)
