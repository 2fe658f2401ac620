"""The broker process: gRPC services over the topic manager."""
