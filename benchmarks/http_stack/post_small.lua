-- POST a ~120-byte KServe V2 JSON infer request (one FP32 input of 4 elements).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"id":"42","inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[0.25,0.5,0.75,1.0]}],"outputs":[{"name":"y"}]}'
