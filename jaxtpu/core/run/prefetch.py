"""The input thread (framework-free): the next device calls' inputs built while the devices
run the current one, through a bounded queue, as torch_xla's ParallelLoader does."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

_END = object()


class Prefetch:
    """Builds the next device calls' inputs on a background thread (host gather, then
    `backend.prepare`: stacking and the transfer to the devices) while the devices run the
    current one, through a bounded queue: torch_xla's ParallelLoader, for both sides.

    `wait_s` adds up the time the loop waited for its input: when it grows, the host does not
    keep up with the devices. Errors on the thread are raised in the loop."""

    def __init__(self, items: Iterator[Any], depth: int = 2) -> None:
        self.wait_s = 0.0
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._work, args=(items,), name="jaxtpu-input", daemon=True
        )
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _work(self, items: Iterator[Any]) -> None:
        try:
            for item in items:
                if not self._put((item, None)):
                    return
            self._put((_END, None))
        except BaseException as e:  # noqa: BLE001 - handed to the loop, raised there
            self._put((_END, e))

    def __iter__(self) -> Iterator[Any]:
        while True:
            t0 = time.perf_counter()
            item, error = self._queue.get()
            self.wait_s += time.perf_counter() - t0
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
