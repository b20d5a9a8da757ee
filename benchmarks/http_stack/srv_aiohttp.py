"""aiohttp.web on uvloop. Usage: python srv_aiohttp.py PORT"""
import sys

import uvloop
from aiohttp import web
from common import CHUNKS, HEALTH, INFER, chunk_report, infer


async def live(request):
    return web.Response()


async def model_infer(request):
    return web.Response(body=infer(await request.read()), content_type="application/json")


async def chunks(request):
    cs = [c async for c in request.content.iter_any()]
    return web.Response(body=chunk_report([len(c) for c in cs], [type(c).__name__ for c in cs]),
                        content_type="application/json")


app = web.Application(client_max_size=64 * 1024 * 1024)  # default limit is 1 MiB -> 413 on 2 MB bodies
app.add_routes([web.get(HEALTH, live, allow_head=False), web.post(INFER, model_infer), web.post(CHUNKS, chunks)])

if __name__ == "__main__":
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None,
                loop=uvloop.new_event_loop())
