"""The null platform: lowers and plans memory without running anything (device-free checks)."""
