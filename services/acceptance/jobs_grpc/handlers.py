"""The JobService's method handlers, registered from the service descriptor with a request parser that
never raises: bytes that are not the request message (a string field holding invalid UTF-8, a
truncated message) are INVALID_ARGUMENT with a BadRequest, like any other client mistake (DESIGN
§5.11), instead of the UNKNOWN and server-side traceback grpc answers when its parser raises.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message

from services.acceptance.jobs_grpc import status
from services.common.api.errors import ApiError
from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["JobService"]


@dataclass(frozen=True)
class Undecodable:
    """What the parser hands on instead of a request it could not read."""

    message_type: str
    reason: str

    def error(self) -> ApiError:
        return ApiError(
            f"the request is not a valid {self.message_type} message: {self.reason}", code="malformed_request"
        )


def _parser(method: MethodDescriptor) -> Callable[[bytes], Message | Undecodable]:
    message_class = message_factory.GetMessageClass(method.input_type)

    def parse(data: bytes) -> Message | Undecodable:
        try:
            parsed: Message = message_class.FromString(data)
        except DecodeError as exc:
            return Undecodable(
                method.input_type.full_name, str(exc).rpartition(": ")[2] or "cannot be parsed"
            )
        return parsed

    return parse


async def _refuse(request: Undecodable, context: Any) -> None:
    answer = status.to_status(request.error())
    await context.abort(answer.code, answer.details, answer.trailing_metadata)


def _unary(behaviour: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    async def handle(request: Any, context: Any) -> Any:
        if isinstance(request, Undecodable):
            await _refuse(request, context)
        return await behaviour(request, context)

    return handle


def _streaming(
    behaviour: Callable[[Any, Any], AsyncIterator[Any]],
) -> Callable[[Any, Any], AsyncIterator[Any]]:
    async def handle(request: Any, context: Any) -> AsyncIterator[Any]:
        if isinstance(request, Undecodable):
            await _refuse(request, context)
        async for item in behaviour(request, context):
            yield item

    return handle


def _serialize(message: Message | bytes) -> bytes:
    # A stream may hand over a message it has encoded already (Watch encodes each event once).
    return message if isinstance(message, bytes) else message.SerializeToString()


def job_service_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """Every method of ``fatura.jobs.v1.JobService``, served by the servicer's method of its name."""
    handlers = {}
    for method in SERVICE.methods:
        behaviour = getattr(servicer, method.name)
        if method.client_streaming:
            raise TypeError(f"{method.full_name}: client streaming has no handler here")
        if method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                _streaming(behaviour), request_deserializer=_parser(method), response_serializer=_serialize
            )
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _unary(behaviour), request_deserializer=_parser(method), response_serializer=_serialize
            )
    return grpc.method_handlers_generic_handler(SERVICE.full_name, handlers)
