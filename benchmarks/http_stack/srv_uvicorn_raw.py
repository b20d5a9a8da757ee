"""uvicorn (uvloop + httptools, 1 worker) serving the raw ASGI app. Usage: python srv_uvicorn_raw.py PORT"""
import sys

import uvicorn

if __name__ == "__main__":
    uvicorn.run("app_raw:app", host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
                workers=1, access_log=False, log_level="warning")
