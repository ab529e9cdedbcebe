"""``kvstore hitrate``: replay traffic logs through simulated HBM/DRAM/SSD tiers (DESIGN §10)."""
