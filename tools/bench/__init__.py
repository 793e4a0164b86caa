"""`dsgraph bench`: roofline calibration, kernel side-by-sides and model step throughput on one GPU."""
