"""uvicorn (uvloop + httptools) serving a starlette Router. Usage: python srv_starlette.py PORT"""
import sys

import uvicorn
from common import CHUNKS, HEALTH, INFER, chunk_report, infer
from starlette.responses import Response
from starlette.routing import Route, Router


async def live(request):
    return Response(status_code=200)


async def model_infer(request):
    return Response(infer(await request.body()), media_type="application/json")


async def chunks(request):
    cs = [c async for c in request.stream() if c]
    return Response(chunk_report([len(c) for c in cs], [type(c).__name__ for c in cs]), media_type="application/json")


app = Router(routes=[Route(HEALTH, live, methods=["GET"]), Route(INFER, model_infer, methods=["POST"]),
                     Route(CHUNKS, chunks, methods=["POST"])])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
                workers=1, access_log=False, log_level="warning")
