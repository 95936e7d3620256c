"""Training: data pipeline, objectives and the accelerate training loop."""
