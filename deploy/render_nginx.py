"""Render deploy/nginx.conf.template for N ``selfrag serve`` replicas (standard library only).

    python deploy/render_nginx.py --listen 0.0.0.0:8080 --replica selfrag-1:8000 --replica selfrag-2:8000 \
        --run-dir /var/run/nginx-selfrag > /etc/nginx/nginx.conf
    nginx -c /etc/nginx/nginx.conf -e /var/run/nginx-selfrag/error.log

``--run-dir`` holds the pid file, the logs and nginx's temp folders (created here). As root, nginx runs its workers
as ``--user`` (default: nobody, nginx's own default); ``--user ''`` leaves the user line out.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

TEMPLATE = Path(__file__).with_name("nginx.conf.template")


def render(listen: str, replicas: list[str], run_dir: Path, user: str = "", workers: int = 1, max_fails: int = 1,
           fail_timeout_s: float = 5.0, read_timeout_s: float = 600.0) -> str:
    """The nginx config text; ``replicas`` are ``host:port`` of each ``selfrag serve``."""
    if not replicas:
        raise ValueError("give at least one --replica host:port")
    for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (run_dir / name).mkdir(parents=True, exist_ok=True)
    servers = "\n".join(f"        server {replica} max_fails={max_fails} fail_timeout={fail_timeout_s:g}s;"
                        for replica in replicas)
    values = {"USER_LINE": f"user {user};" if user else "", "WORKERS": workers, "RUN_DIR": run_dir.resolve(),
              "SERVERS": servers, "LISTEN": listen, "READ_TIMEOUT_S": f"{read_timeout_s:g}", "TRIES": len(replicas)}
    # only ${NAME} fields: nginx's own $variables stay as they are
    return re.sub(r"\$\{([A-Z_]+)\}", lambda match: str(values[match.group(1)]), TEMPLATE.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="0.0.0.0:8080", help="address:port nginx listens on")
    parser.add_argument("--replica", action="append", required=True, help="host:port of one replica (repeat)")
    parser.add_argument("--run-dir", type=Path, default=Path("/var/run/nginx-selfrag"), help="pid, logs, temp files")
    parser.add_argument("--user", default="", help="user of the worker processes when nginx starts as root")
    parser.add_argument("--workers", type=int, default=1, help="nginx worker processes")
    parser.add_argument("--fail-timeout", type=float, default=5.0, help="seconds a failed replica is skipped")
    parser.add_argument("--read-timeout", type=float, default=600.0, help="longest answer in seconds (>= timeout_s)")
    args = parser.parse_args(argv)
    sys.stdout.write(render(args.listen, args.replica, args.run_dir, args.user, args.workers,
                            fail_timeout_s=args.fail_timeout, read_timeout_s=args.read_timeout))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
