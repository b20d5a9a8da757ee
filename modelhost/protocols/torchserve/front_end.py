"""The TorchServe front-ends: its inference API on the inference address (and, where the management address is the
same, the management API with it, as SageMaker's containers configure it), each a port of its own."""

from __future__ import annotations

from modelhost.protocols.front_end import FrontEnd
from modelhost.protocols.http.app import HttpApp, Route
from modelhost.protocols.torchserve import inference, management
from modelhost.protocols.torchserve.answers import app_error
from modelhost.protocols.torchserve.config_properties import Address
from modelhost.protocols.torchserve.serving import TorchServing


class TorchServeFrontEnd(FrontEnd):
    def __init__(self, name: str, address: Address, routes: list[Route], max_body_bytes: int) -> None:
        self.name = name
        self.host = address.host
        self.port = address.port
        self.app = HttpApp(routes, max_body_bytes=max_body_bytes, errors=app_error)


def torchserve_front_ends(serving: TorchServing) -> list[FrontEnd]:
    config = serving.config
    if config.management_address == config.inference_address:  # one listener, both APIs (SageMaker's)
        return [TorchServeFrontEnd("TorchServe", config.inference_address,
                                   inference.routes(serving) + management.routes(serving), config.max_request_size)]
    return [TorchServeFrontEnd("TorchServe inference", config.inference_address, inference.routes(serving),
                               config.max_request_size),
            TorchServeFrontEnd("TorchServe management", config.management_address, management.routes(serving),
                               config.max_request_size)]
