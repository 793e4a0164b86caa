"""Oracle tests: the model against independent references (NeMo for V4.1), and the harness."""
