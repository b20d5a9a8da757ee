"""Triton's shared memory RPCs of `inference.GRPCInferenceService`: SystemSharedMemory{Status,Register,
Unregister}, and CudaSharedMemory*, which this server, without GPU support, answers as a server with no CUDA
regions (registering one is UNIMPLEMENTED). The gRPC twin of shm_rest.py; grpc.py lists these with its own."""

from __future__ import annotations

from modelhost.access import Api
from modelhost.core.shared_memory import SharedMemory
from modelhost.errors import ErrorKind, ModelhostError, not_found
from modelhost.protocols.grpc_service import Unary
from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb
from modelhost.protocols.kserve_v2.shm_rest import NO_CUDA


def rpcs(regions: SharedMemory) -> list[Unary]:
    async def status(request: pb.SystemSharedMemoryStatusRequest) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for s in regions.status(request.name):
            response.regions[s.name].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(
                name=s.name, key=s.key, offset=s.offset, byte_size=s.byte_size))
        return response

    async def register(request: pb.SystemSharedMemoryRegisterRequest) -> pb.SystemSharedMemoryRegisterResponse:
        regions.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def unregister(request: pb.SystemSharedMemoryUnregisterRequest) -> pb.SystemSharedMemoryUnregisterResponse:
        regions.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def cuda_status(request: pb.CudaSharedMemoryStatusRequest) -> pb.CudaSharedMemoryStatusResponse:
        if request.name:
            raise not_found(f"no CUDA shared memory region '{request.name}': {NO_CUDA}")
        return pb.CudaSharedMemoryStatusResponse()

    async def cuda_register(request: pb.CudaSharedMemoryRegisterRequest) -> pb.CudaSharedMemoryRegisterResponse:
        raise ModelhostError(ErrorKind.UNSUPPORTED, NO_CUDA)

    async def cuda_unregister(request: pb.CudaSharedMemoryUnregisterRequest) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()  # there is none to unregister

    api = Api.SHARED_MEMORY
    return [
        Unary("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest, status, api),
        Unary("SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest, register, api),
        Unary("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest, unregister, api),
        Unary("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest, cuda_status, api),
        Unary("CudaSharedMemoryRegister", pb.CudaSharedMemoryRegisterRequest, cuda_register, api),
        Unary("CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest, cuda_unregister, api),
    ]
