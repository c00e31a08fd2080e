"""The service client: typed models, one error tree, retries and a shared rate limiter."""

from daemon.upstream.client import MAX_BULK, CallRecord, ServiceClient
from daemon.upstream.credentials import Credentials, CredentialsHolder
from daemon.upstream.errors import (
    BadRequest,
    ConnectionFailed,
    InvalidResponse,
    NotFound,
    RateLimited,
    ResponseError,
    ServerError,
    ServiceError,
    Timeout,
    TransportError,
    Unauthorized,
)
from daemon.upstream.models import (
    AccountRecord,
    BulkAction,
    BulkFilter,
    BulkResult,
    DLQMessage,
    EndpointRef,
    FlowControl,
    Overrides,
    URLGroup,
    WorkflowRun,
)
from daemon.upstream.ratelimit import RateLimiter
from daemon.upstream.retry import RetryPolicy

__all__ = [
    "MAX_BULK",
    "AccountRecord",
    "BadRequest",
    "BulkAction",
    "BulkFilter",
    "BulkResult",
    "CallRecord",
    "ConnectionFailed",
    "Credentials",
    "CredentialsHolder",
    "DLQMessage",
    "EndpointRef",
    "FlowControl",
    "InvalidResponse",
    "NotFound",
    "Overrides",
    "RateLimited",
    "RateLimiter",
    "ResponseError",
    "RetryPolicy",
    "ServerError",
    "ServiceClient",
    "ServiceError",
    "Timeout",
    "TransportError",
    "URLGroup",
    "Unauthorized",
    "WorkflowRun",
]
