"""granian (ASGI interface, 1 worker, uvloop, HTTP/1) serving the raw ASGI app. Usage: python srv_granian.py PORT"""
import sys

from granian import Granian
from granian.constants import HTTPModes, Interfaces, Loops

if __name__ == "__main__":
    Granian("app_raw:app", address="127.0.0.1", port=int(sys.argv[1]), interface=Interfaces.ASGI, workers=1,
            loop=Loops.uvloop, http=HTTPModes.http1, log_access=False).serve()
