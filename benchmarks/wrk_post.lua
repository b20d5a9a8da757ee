-- POST the file named by $BODY_FILE; $HEADER_LENGTH, when set, becomes Inference-Header-Content-Length.
local f = assert(io.open(assert(os.getenv("BODY_FILE"), "set BODY_FILE"), "rb"))
wrk.body = f:read("*a")
f:close()
wrk.method = "POST"
local header_length = os.getenv("HEADER_LENGTH")
if header_length and header_length ~= "" then
  wrk.headers["Inference-Header-Content-Length"] = header_length
  wrk.headers["Content-Type"] = "application/octet-stream"
else
  wrk.headers["Content-Type"] = "application/json"
end
