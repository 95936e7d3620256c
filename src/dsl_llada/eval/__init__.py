"""Evaluation: generation, calibration and error-correction metrics."""
