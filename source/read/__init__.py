"""The read engine and start positions (beside the transport)."""
