"""Summarise a ``py-spy record --format raw --threads`` file: where each thread spends its samples.

    python -m bench.profile FILE [--top N] [--match TEXT]

For each thread: its share of all samples, then the functions with the most
samples anywhere on the stack (inclusive) and on top of it (self).  Idle
samples (py-spy's ``--idle`` is off by default) are not in the file, so a
share is time on CPU or in a blocking call that py-spy counts as active.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

_THREAD = re.compile(r"^thread \(\d+\): ([^;]*)")


@dataclass
class ThreadProfile:
    samples: int = 0
    inclusive: Counter[str] = field(default_factory=Counter)
    own: Counter[str] = field(default_factory=Counter)


def _thread_name(frame: str) -> str:
    match = _THREAD.match(frame)
    name = match.group(1) if match else frame
    # Reader threads are numbered; count them as one pool.
    return re.sub(r"_\d+$", "", name)


def _function(frame: str) -> str:
    # "name (path:line)" -> "name (path)": lines of one function counted together.
    return re.sub(r":\d+\)$", ")", frame)


def load(path: Path) -> dict[str, ThreadProfile]:
    threads: dict[str, ThreadProfile] = defaultdict(ThreadProfile)
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        prof = threads[_thread_name(frames[0])]
        prof.samples += n
        funcs = [_function(f) for f in frames[1:]]
        for func in set(funcs):
            prof.inclusive[func] += n
        if funcs:
            prof.own[funcs[-1]] += n
    return dict(threads)


def report(threads: dict[str, ThreadProfile], top: int = 15, match: str = "") -> str:
    total = sum(t.samples for t in threads.values()) or 1
    out: list[str] = []
    for name, prof in sorted(threads.items(), key=lambda kv: -kv[1].samples):
        out.append(f"== {name}: {prof.samples} samples ({100 * prof.samples / total:.0f}%)")
        for title, counter in (("inclusive", prof.inclusive), ("self", prof.own)):
            out.append(f"   -- {title}")
            shown = [(f, n) for f, n in counter.most_common() if match in f][:top]
            for func, n in shown:
                out.append(f"   {100 * n / prof.samples:5.1f}%  {func}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--match", default="")
    args = parser.parse_args()
    print(report(load(args.file), args.top, args.match))


if __name__ == "__main__":
    main()
