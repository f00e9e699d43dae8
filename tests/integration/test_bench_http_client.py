"""The load generators' HTTP client (bench/http_client.py) against a real HTTP server on loopback:
every request arrives whole with its own headers and body, answers come back with their status over
at most ``limit`` kept-alive connections, a connection the server closes is replaced, and a server
that drops a request mid-answer is an error for that request only."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop
from aiohttp import web

from bench.http_client import HttpClient, request_prefix

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def serve_and_run(handler: Handler, scenario: Callable[[str, int], Awaitable[Any]]) -> Any:
    """``scenario(host, port)`` on uvloop (as the generators run) beside an aiohttp server."""

    async def main() -> Any:
        app = web.Application()
        app.router.add_post("/v1/things", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            return await scenario("127.0.0.1", port)
        finally:
            await runner.cleanup()

    return uvloop.run(main())


def test_concurrent_posts_arrive_whole_and_share_at_most_limit_connections() -> None:
    seen: list[tuple[str, str, bytes]] = []
    peers: set[Any] = set()

    async def handler(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        seen.append((request.headers["Idempotency-Key"], request.headers["X-Api-Key"], await request.read()))
        await asyncio.sleep(0.01)
        return web.json_response({"ok": True}, status=202)

    async def scenario(host: str, port: int) -> list[int]:
        _, _, prefix = request_prefix(f"http://{host}:{port}/v1/things", {"X-Api-Key": "secret"})
        client = HttpClient(host, port, limit=4)
        try:
            calls = [
                client.request(prefix, f"Idempotency-Key: k-{i}\r\n".encode(), b'{"n": %d}' % i)
                for i in range(40)
            ]
            return list(await asyncio.gather(*calls))
        finally:
            client.close()

    statuses = serve_and_run(handler, scenario)
    # Every answer's status, every request whole with its own key and body, over at most 4 connections
    assert statuses == [202] * 40
    assert sorted(seen) == sorted((f"k-{i}", "secret", b'{"n": %d}' % i) for i in range(40))
    assert 1 <= len(peers) <= 4


def test_a_connection_the_server_closes_is_replaced() -> None:
    peers: list[Any] = []

    async def handler(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        await request.read()
        # Every answer asks to close its connection
        return web.Response(status=201, text="made", headers={"Connection": "close"})

    async def scenario(host: str, port: int) -> list[int]:
        _, _, prefix = request_prefix(f"http://{host}:{port}/v1/things", {})
        client = HttpClient(host, port, limit=1)
        try:
            return [await client.request(prefix, b"", b"x") for _ in range(5)]
        finally:
            client.close()

    # Then each request is answered, each on a new connection
    assert serve_and_run(handler, scenario) == [201] * 5
    assert len(set(peers)) == 5


def test_chunked_and_error_answers_give_their_status() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if body == b"chunked":
            response = web.StreamResponse(status=200)
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(b"part one, ")
            await response.write(b"part two")
            await response.write_eof()
            return response
        return web.json_response({"error": {"code": "nope"}}, status=422)

    async def scenario(host: str, port: int) -> list[int]:
        _, _, prefix = request_prefix(f"http://{host}:{port}/v1/things", {})
        client = HttpClient(host, port, limit=1)
        try:
            return [await client.request(prefix, b"", body) for body in (b"chunked", b"bad", b"chunked")]
        finally:
            client.close()

    assert serve_and_run(handler, scenario) == [200, 422, 200]


def test_a_request_the_server_drops_fails_alone_and_the_next_one_gets_through() -> None:
    async def handler(request: web.Request) -> web.Response:
        if await request.read() == b"drop":
            assert request.transport is not None
            request.transport.abort()  # the connection dies before any answer
        return web.Response(status=202)

    async def scenario(host: str, port: int) -> tuple[BaseException | int, ...]:
        _, _, prefix = request_prefix(f"http://{host}:{port}/v1/things", {})
        client = HttpClient(host, port, limit=1)
        try:
            results: list[BaseException | int] = []
            for body in (b"ok", b"drop", b"ok"):
                try:
                    async with asyncio.timeout(5):
                        results.append(await client.request(prefix, b"", body))
                except OSError as exc:
                    results.append(exc)
            return tuple(results)
        finally:
            client.close()

    first, dropped, after = serve_and_run(handler, scenario)
    assert first == 202 and after == 202
    assert isinstance(dropped, ConnectionResetError)


def test_a_request_that_times_out_frees_its_connection_slot() -> None:
    async def handler(request: web.Request) -> web.Response:
        if await request.read() == b"slow":
            await asyncio.sleep(2)
        return web.Response(status=202)

    async def scenario(host: str, port: int) -> tuple[bool, int]:
        _, _, prefix = request_prefix(f"http://{host}:{port}/v1/things", {})
        client = HttpClient(host, port, limit=1)
        try:
            try:
                async with asyncio.timeout(0.2):
                    await client.request(prefix, b"", b"slow")
                timed_out = False
            except TimeoutError:
                timed_out = True
            # The only slot was the slow request's: the next request gets a new connection at once
            async with asyncio.timeout(5):
                return timed_out, await client.request(prefix, b"", b"fast")
        finally:
            client.close()

    assert serve_and_run(handler, scenario) == (True, 202)


def test_only_plain_http_urls_are_accepted() -> None:
    with pytest.raises(ValueError, match="plain HTTP"):
        request_prefix("https://127.0.0.1:8443/v1/things", {})
    assert request_prefix("http://127.0.0.1:8080/v1/things?x=1", {"A": "b"}) == (
        "127.0.0.1",
        8080,
        b"POST /v1/things?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nA: b\r\n",
    )


def test_requests_rotate_over_every_open_connection() -> None:
    peers: list[Any] = []

    async def handler(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        await request.read()
        return web.Response(status=202)

    async def scenario(host: str, port: int) -> list[int]:
        _, _, prefix = request_prefix(f"http://{host}:{port}/v1/things", {})
        client = HttpClient(host, port, limit=4)
        try:
            await client.connect_all()
            # One request at a time, as a light load sends them
            return [await client.request(prefix, b"", b"x") for _ in range(40)]
        finally:
            client.close()

    assert serve_and_run(handler, scenario) == [202] * 40
    # Then each of the four connections carried a quarter of them, not the most recent one all
    assert sorted(Counter(peers).values()) == [10, 10, 10, 10]
