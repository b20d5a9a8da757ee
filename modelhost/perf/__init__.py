"""`modelhost perf`: a load generator for KServe V2 servers, and its reports."""
