"""``kvstore loadgen``: trace-driven load against a real store, checked against the simulator."""
