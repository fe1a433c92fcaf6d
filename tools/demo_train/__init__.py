"""The demo model's data generator, training and evaluation (see tools/train_demo.py)."""
