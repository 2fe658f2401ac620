"""What a process tells its operators: the HTTP endpoint beside its gRPC port (`/metrics`,
`/healthz`, `/readyz`: http.py) and the gRPC request series (rpc_metrics.py). Every role (source
broker, shadow broker, compaction worker) serves one; what each role measures lives with the
role (source/broker/metrics.py, shadow/metrics.py, compaction/metrics.py)."""
