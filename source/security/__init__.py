"""Security: TLS on gRPC ports (tls.py), certificates (certs.py), JWT tokens (tokens.py)."""
