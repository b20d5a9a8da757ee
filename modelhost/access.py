"""Access control: which API group a route or RPC belongs to, and the credential a group requires.

One mechanism for Triton's `--http-restricted-api` / `--grpc-restricted-protocol` (`<apis>:<key>=<value>`:
a request to those APIs must carry header `<key>` with `<value>`; over gRPC the metadata key is
`triton-grpc-protocol-<key>`) and TorchServe-style bearer tokens from a file (`Authorization: Bearer <token>`).
Each group has at most one credential per protocol. Protocol front-ends declare each route's group;
protocols/http/app.py and protocols/grpc_handlers.py ask `AccessPolicy.check` once per request, before the handler.
Pure Python (no web framework): settings.py parses the flags with it, the servers enforce with it.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

GRPC_HEADER_PREFIX = "triton-grpc-protocol-"  # Triton's: gRPC restrictions name `<prefix><key>`
BEARER_HEADER = "authorization"


class Api(str, Enum):
    """API groups, named as Triton names them (plus `metrics`, the metrics port)."""

    HEALTH = "health"  # live/ready, model ready, SageMaker /ping
    METADATA = "metadata"  # server and model metadata
    INFERENCE = "inference"  # infer, TF Serving predict, SageMaker invocations
    MODEL_CONFIG = "model-config"
    MODEL_REPOSITORY = "model-repository"  # index, load, unload; SageMaker's /models
    STATISTICS = "statistics"
    TRACE = "trace"  # the trace extension's settings
    LOGGING = "logging"  # Triton's logging extension: GET/POST /v2/logging, gRPC LogSettings
    METRICS = "metrics"  # GET /metrics on the metrics port (modelhost's own; Triton has none)
    SHARED_MEMORY = "shared-memory"  # register, status, unregister of client shared memory regions


# Names a Triton command line may use: `management` is ours (= model-repository).
_ALIASES: dict[str, tuple[Api, ...]] = {"management": (Api.MODEL_REPOSITORY,)}
API_NAMES = tuple(api.value for api in Api) + tuple(_ALIASES)


@dataclass(frozen=True, slots=True)
class Restriction:
    """Requests to `apis` must send header `header` (lowercase) with exactly `value`."""

    apis: tuple[Api, ...]
    header: str
    value: str

    def describe(self) -> str:
        """For logs and errors: never the value."""
        return f"{','.join(api.value for api in self.apis)} (header '{self.header}')"


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a request was refused: `missing` (no credential: 401 / UNAUTHENTICATED) or a wrong one
    (403 / PERMISSION_DENIED). The message names the API group and the header, never the expected value."""

    missing: bool
    message: str


def parse_restriction(text: str, header_prefix: str = "") -> Restriction:
    """`<api>[,<api>...]:<key>=<value>` (Triton's syntax); ValueError naming what is wrong."""
    apis_text, colon, credential = text.partition(":")
    key, equals, value = credential.partition("=")
    key = key.strip().lower()
    if not colon or not equals or not key or not value:
        raise ValueError(f"'{_redacted(text)}' is not <api>[,<api>...]:<header>=<value>")
    if any(c in key for c in " \t\r\n:") or any(c in value for c in "\r\n\0"):
        raise ValueError(f"'{_redacted(text)}': the header name or value has a character a header cannot carry")
    return Restriction(parse_apis(apis_text.split(",")), header_prefix + key, value)


def parse_apis(names: Iterable[str]) -> tuple[Api, ...]:
    apis: list[Api] = []
    for name in (n.strip().lower() for n in names):
        if name in _ALIASES:
            apis += _ALIASES[name]
        elif name in {api.value for api in Api}:
            apis.append(Api(name))
        else:
            raise ValueError(f"unknown API '{name}' (known: {', '.join(API_NAMES)})")
    return tuple(dict.fromkeys(apis))


def parse_token_file(text: str) -> tuple[Restriction, ...]:
    """A JSON object of `"<api>[,<api>...]": "<token>"`: each token is sent as `Authorization: Bearer <token>`."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(document, dict) or not document:
        raise ValueError('must be a JSON object like {"inference": "<token>", "model-repository": "<token>"}')
    restrictions = []
    for apis, token in document.items():
        if not isinstance(token, str) or len(token) < 16 or any(c.isspace() for c in token):
            raise ValueError(f"the token for '{apis}' must be a string of at least 16 characters without spaces")
        restrictions.append(Restriction(parse_apis(apis.split(",")), BEARER_HEADER, f"Bearer {token}"))
    return tuple(restrictions)


class AccessPolicy:
    """The restrictions of one protocol (HTTP or gRPC); an empty policy lets everything through."""

    def __init__(self, restrictions: Sequence[Restriction] = ()) -> None:
        self._by_api: dict[Api, tuple[str, bytes]] = {}
        for restriction in restrictions:
            for api in restriction.apis:
                if api in self._by_api:
                    raise ValueError(f"API '{api.value}' is restricted twice; each API takes one credential")
                self._by_api[api] = (restriction.header, restriction.value.encode("latin-1", "replace"))

    def __bool__(self) -> bool:
        return bool(self._by_api)

    def header(self, api: Api) -> str | None:
        """The header `api` requires, or None when it is open."""
        required = self._by_api.get(api)
        return None if required is None else required[0]

    def check(self, api: Api, sent: bytes | str | None) -> Denial | None:
        """None if `sent` (the value of `header(api)` in the request, None if absent) opens `api`."""
        required = self._by_api.get(api)
        if required is None:
            return None
        header, expected = required
        if sent is None:
            return Denial(True, f"the {api.value} API is restricted: send the '{header}' header")
        if isinstance(sent, str):
            sent = sent.encode("latin-1", "replace")
        if not hmac.compare_digest(sent, expected):  # constant time: the value is a secret
            return Denial(False, f"the '{header}' header does not grant access to the {api.value} API")
        return None


def _redacted(text: str) -> str:
    """A restriction flag for an error message, without its secret value."""
    head, _, value = text.partition("=")
    return f"{head}=***" if value else head
