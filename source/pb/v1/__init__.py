"""Generated protobuf code (scripts/gen_proto.py); do not edit."""
