-- POST the binary file named by $BODY_FILE (2,000,000 random bytes) as the request body.
local f = assert(io.open(assert(os.getenv("BODY_FILE"), "set BODY_FILE"), "rb"))
wrk.body = f:read("*a")
f:close()
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = "0"
