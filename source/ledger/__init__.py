"""Ledger engine: WAL, sealed Parquet ledgers, the managed ledger and the ledger-view seam."""
