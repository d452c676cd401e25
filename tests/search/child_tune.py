"""Run one tuning process for the kill/resume and concurrency tests (``python child_tune.py ARGS``).

The replay backend sleeps ``--delay`` seconds per measurement so the parent has time to kill it mid-run or
to let two of these overlap.  With ``--wait-for FILE`` it first writes ``--ready FILE`` and waits until the
parent creates FILE, so two processes start tuning at the same moment.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import matmul_table

import schedlib.search as S


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--trials", type=int, required=True)
    p.add_argument("--strategy", default="random")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--ready")
    p.add_argument("--wait-for")
    args = p.parse_args()
    func, table = matmul_table(512, 512, 512)
    backend = S.ReplayBackend(table, delay_s=args.delay)
    if args.ready:
        Path(args.ready).write_text(str(os.getpid()))
    if args.wait_for:
        deadline = time.time() + 120
        while not Path(args.wait_for).exists():
            if time.time() > deadline:
                raise SystemExit("the parent never said go")
            time.sleep(0.01)
    res = S.tune(func, "h100", trials=args.trials, strategy=args.strategy, storage=args.storage, backend=backend,
                 quiet=True, seed=args.seed)
    print(f"measured_now={res.measured_now}")


if __name__ == "__main__":
    main()
