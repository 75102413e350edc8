"""Runs the blocks of one docs page per request, each page in a fresh process
(for tests/project/test_readme.py).

This process imports torch and readers once, then forks a child per page: the child has its own
namespace, working directory and output file, as if the page were run in a new interpreter, without
paying torch's import again for every page.

Requests are JSON lines on stdin: {"plan": PLAN.json, "cwd": DIR, "log": FILE, "timeout": SECONDS}.
The answer to each is one line on stdout: the child's exit status (negative: the signal that ended
it; SIGALRM when the page ran past its timeout).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback

import torch  # noqa: F401 - imported once here, inherited by every page's process

import readers  # noqa: F401


def run_blocks(blocks: list[dict]) -> int:
    namespace = {"__name__": "__readme__"}
    for block in blocks:
        where = f"{block['page']}:{block['line']}"
        print(f"--- {where} ({block['lang'] or 'shell'})", flush=True)
        started = time.perf_counter()
        try:
            if block["first_run"]:
                subprocess.run(["bash", "-euo", "pipefail", "-c", block["first_run"]], check=True)
            if block["lang"] == "python":
                if block["given"]:
                    exec(block["given"], namespace)
                exec(compile(block["code"], where, "exec"), namespace)
            else:
                subprocess.run(["bash", "-euo", "pipefail", "-c", block["code"]], check=True)
        except BaseException:
            traceback.print_exc()
            print(f"FAILED: the block at {where}", flush=True)
            return 1
        print(f"    {time.perf_counter() - started:.1f} s", flush=True)
    print("ALL BLOCKS RAN", flush=True)
    return 0


def run_page(request: dict) -> int:
    """In the forked child: stdin from /dev/null, stdout and stderr into the log, then the blocks."""
    os.chdir(request["cwd"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the requests pipe is the parent's alone
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    signal.alarm(int(request["timeout"]))
    return run_blocks(json.loads(open(request["plan"], encoding="utf-8").read()))


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = run_page(request)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
    os._exit(0)  # stdin closed: no need to wait for torch's interpreter teardown


if __name__ == "__main__":
    main()
