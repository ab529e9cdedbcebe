"""The daemon's access log (DESIGN §8): one Parquet row per ``Lookup``."""
