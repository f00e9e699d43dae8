"""The gateway's transport: a connection pool per calling thread (``ThreadPools``)."""

from __future__ import annotations

import threading
from typing import Any

import httpx

from services.inference.providers.gateway import ThreadPools


class Pool(httpx.BaseTransport):
    """Answers 200 and remembers which threads sent through it and whether it was closed."""

    def __init__(self) -> None:
        self.senders: list[int] = []
        self.closed = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.senders.append(threading.get_ident())
        return httpx.Response(200, request=request)

    def close(self) -> None:
        self.closed += 1


def pools_made() -> tuple[ThreadPools, list[Pool]]:
    made: list[Pool] = []

    def make() -> Any:
        made.append(Pool())
        return made[-1]

    return ThreadPools(make), made


def send(transport: ThreadPools, times: int = 1) -> None:
    for _ in range(times):
        transport.handle_request(httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions"))


def in_threads(n: int, fn: Any) -> None:
    threads = [threading.Thread(target=fn) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_each_thread_sends_through_a_pool_of_its_own_and_keeps_it() -> None:
    # Given the gateway's transport, and four threads that each send three requests
    transport, made = pools_made()
    start = threading.Barrier(4)

    def slot() -> None:
        start.wait()  # all four alive at once, so no thread id is reused
        send(transport, 3)

    in_threads(4, slot)
    # Then four pools were made, each carrying the three requests of one thread
    assert len(made) == 4
    assert all(len(pool.senders) == 3 and len(set(pool.senders)) == 1 for pool in made)
    assert len({pool.senders[0] for pool in made}) == 4


def test_closing_the_transport_closes_every_threads_pool() -> None:
    transport, made = pools_made()
    send(transport)
    in_threads(3, lambda: send(transport))
    transport.close()
    assert len(made) == 4 and all(pool.closed == 1 for pool in made)


def test_the_pool_of_a_thread_that_ended_is_closed_when_another_thread_makes_its_pool() -> None:
    # Given a thread that sent a request and ended
    transport, made = pools_made()
    in_threads(1, lambda: send(transport))
    assert made[0].closed == 0
    # When another thread sends its first request
    send(transport)
    # Then the ended thread's pool is closed, and the new one is not
    assert made[0].closed == 1 and made[1].closed == 0
    transport.close()
    assert made[0].closed == 1 and made[1].closed == 1
