"""Every picture under docs/img, from one command: run the benchmarks, keep their JSON, draw.

  python benchmarks/figures.py                  # the benchmarks at picture sizes (~10 min on
                                                # 2 cores), JSON in docs/img/data/, pictures in
                                                # docs/img/ (PNG and SVG)
  python benchmarks/figures.py --quick --out /tmp/img    # smoke sizes, about a minute
  python benchmarks/figures.py --from-json docs/img/data # redraw only, no benchmark run
  python benchmarks/figures.py --only smart,lag          # run some, draw from all in data/

The runs, one after another (each a subprocess, its own output shown):

  backends-sqlite, backends-postgres, backends-redis
        bench_backends.py --backend B --workloads 1,2 --json data/backends-B.json
        (the agent loop at concurrency 1 and 16, and the long thread): storage_growth,
        turn_latency, throughput
  smart bench_smart.py --json data/smart.json: smart_round_trips
  lag   bench_replica_lag.py --json data/replica_lag.json: replica_lag
  floor bench_floor.py --rounds 3 --json data/floor.json: floor

PostgreSQL and Redis come from `--dsn` / `--redis-url` (defaults: $LGCKPT_TEST_PG_DSN,
$LGCKPT_TEST_REDIS_URL, else the local servers); the lag run starts its own redis-server.
A run that fails is reported and the others still run; the pictures its JSON would give are
then drawn from a JSON file already in data/, if any. Exit status 1 when a run failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draw import draw_all

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "docs" / "img"

# run -> (script, arguments at picture size, arguments with --quick)
RUNS: dict[str, tuple[str, list[str], list[str]]] = {
    **{f"backends-{b}": (
        "bench_backends.py",
        ["--backend", b, "--workloads", "1,2", "--threads", "8", "--turns", "20", "--rounds", "1",
         "--long-turns", "300", "--long-rounds", "1"],
        ["--backend", b, "--workloads", "1,2", "--quick", "--threads", "2", "--turns", "3",
         "--long-turns", "15"],
    ) for b in ("sqlite", "postgres", "redis")},
    "smart": ("bench_smart.py", ["--threads", "10", "--turns", "20", "--rounds", "2"],
              ["--threads", "2", "--turns", "4", "--rounds", "1"]),
    "lag": ("bench_replica_lag.py", [], ["--quick"]),
    "floor": ("bench_floor.py", ["--rounds", "3"],
              ["--rounds", "1", "--threads", "2", "--turns", "3"]),
}
JSON_NAMES = {"smart": "smart.json", "lag": "replica_lag.json", "floor": "floor.json"}


def command(run: str, quick: bool, data: Path, args: argparse.Namespace) -> list[str]:
    script, full, smoke = RUNS[run]
    cmd = [sys.executable, str(HERE / script), *(smoke if quick else full),
           "--json", str(data / JSON_NAMES.get(run, f"{run}.json"))]
    if args.dsn:
        cmd += ["--dsn", args.dsn]
    if run.startswith("backends") and args.redis_url:
        cmd += ["--redis-url", args.redis_url]
    return cmd


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="where the pictures go (default docs/img); the JSON goes to OUT/data")
    p.add_argument("--quick", action="store_true", help="smoke sizes: about a minute in all")
    p.add_argument("--only", help=f"comma-separated runs among {','.join(RUNS)} (default all)")
    p.add_argument("--from-json", type=Path, metavar="DIR",
                   help="draw from the JSON files in DIR, run nothing")
    p.add_argument("--dsn", default=os.environ.get("LGCKPT_TEST_PG_DSN"))
    p.add_argument("--redis-url", default=os.environ.get("LGCKPT_TEST_REDIS_URL"))
    args = p.parse_args(argv)
    failed: list[str] = []
    if args.from_json:
        data = args.from_json
    else:
        data = args.out / "data"
        data.mkdir(parents=True, exist_ok=True)
        runs = args.only.split(",") if args.only else list(RUNS)
        unknown = set(runs) - set(RUNS)
        if unknown:
            p.error(f"unknown run(s) {sorted(unknown)}; known: {', '.join(RUNS)}")
        for run in runs:
            cmd = command(run, args.quick, data, args)
            print(f"\n=== {run}: {' '.join(cmd)}", flush=True)
            if subprocess.run(cmd, cwd=HERE.parent).returncode != 0:
                failed.append(run)
    written = draw_all(data, args.out)
    print(f"\ndrew {len(written)} files into {args.out}:")
    for path in written:
        print(f"  {path}")
    if failed:
        print(f"FAILED runs: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
