"""Hand-written ASGI callable (no framework); served by srv_uvicorn_raw.py and srv_granian.py."""
from common import CHUNKS, HEALTH, INFER, chunk_report, infer

JSON_HDRS = [(b"content-type", b"application/json")]


async def _read_chunks(receive):
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            break
        if msg.get("body"):
            chunks.append(msg["body"])
        if not msg.get("more_body", False):
            break
    return chunks


async def _reply(send, status, body=b"", headers=()):
    hdrs = list(headers) + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    path, method = scope["path"], scope["method"]
    if path == HEALTH and method == "GET":
        await _reply(send, 200)
    elif path == INFER and method == "POST":
        chunks = await _read_chunks(receive)
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        await _reply(send, 200, infer(body), JSON_HDRS)
    elif path == CHUNKS and method == "POST":
        chunks = await _read_chunks(receive)
        rep = chunk_report([len(c) for c in chunks], [type(c).__name__ for c in chunks])
        await _reply(send, 200, rep, JSON_HDRS)
    else:
        await _reply(send, 404)
