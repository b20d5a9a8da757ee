"""--workers N: N server processes sharing the HTTP port (SO_REUSEPORT), each a whole modelhost.

Why: at small requests one process is bound by its event loop's Python (HTTP, JSON, checks), not
by the model; two processes on two cores serve ~1.9x the requests of one (tiny, 1 row, c=32).
The trade-off: each worker loads its own copy of every model and batches only its own requests. Each
keeps its own statistics, and a statistics request or a metrics scrape (every worker listens on
--metrics-port) to any of them answers for all of them (core/worker_statistics.py, through Unix sockets
in a directory made here). Each computes on cores / N threads per model, and lends the cores it leaves
idle to the others' large batches (core/spare_cores.py, through an array in the same directory).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
from pathlib import Path
from types import FrameType

from modelhost.core import spare_cores
from modelhost.settings import ServerSettings

log = logging.getLogger("modelhost.workers")


def run_workers(settings: ServerSettings) -> int:
    """Start the workers, forward SIGTERM/SIGINT to them, and return 0 when all of them exit cleanly."""
    with tempfile.TemporaryDirectory(prefix="modelhost-workers-") as directory:  # mode 0700: this server's alone
        return _run(settings, directory)


def _run(settings: ServerSettings, directory: str) -> int:
    context = multiprocessing.get_context("spawn")
    cores = max(1, settings.cpu_count // settings.workers)
    spare_cores.make_shared(Path(directory) / spare_cores.FILE_NAME, settings.workers)
    processes = [
        context.Process(
            target=_worker_main,
            args=(dataclasses.replace(settings, worker_index=index, cpu_count=cores, workers_dir=directory),),
            name=f"modelhost-worker-{index}",
        )
        for index in range(settings.workers)
    ]
    stopping = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for process in processes:
            if process.is_alive() and process.pid is not None:
                process.terminate()  # SIGTERM: each worker drains its in-flight requests

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    if settings.tls_cert_file is not None:
        # Each worker holds its own TLS context: a certificate reload (SIGHUP) goes to all of them.
        def reload(signum: int, frame: FrameType | None) -> None:
            for process in processes:
                if process.is_alive() and process.pid is not None:
                    os.kill(process.pid, signal.SIGHUP)

        signal.signal(signal.SIGHUP, reload)
    for process in processes:
        process.start()
    log.info("started %d workers on HTTP port %d", settings.workers, settings.http_port)
    running = list(processes)
    failed = False
    while running:
        for sentinel in multiprocessing.connection.wait([p.sentinel for p in running]):
            process = next(p for p in running if p.sentinel == sentinel)
            process.join()
            running.remove(process)
            if process.exitcode != 0 and not stopping:
                log.error("%s exited with %s; stopping the others", process.name, process.exitcode)
                failed = True
                forward(signal.SIGTERM, None)
    return 1 if failed else 0


def _worker_main(settings: ServerSettings) -> None:
    logging.basicConfig(level=settings.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s worker {settings.worker_index} %(name)s: %(message)s")
    # Until the server installs its own handlers, a terminal's Ctrl-C (sent to the whole process
    # group) must not kill a worker mid-start: the parent forwards it as SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if settings.tls_cert_file is not None:  # a reload before the server's handler is in place is no stop
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from modelhost.app import Server

    Server(settings).run()
